# pagedkv -- plain GNU make. Everything builds on the CPU with g++ or clang++;
# `make CXX=clang++` switches compilers. Output goes to build/ (or $(BUILD)).
#
#   make            every example and the test binary (CPU build)
#   make run        the main demo
#   make view       make run's workload recorded step by step: build/view.html (open it
#                   in a browser, offline) and build/trace.json (open it in Perfetto)
#   make test       build everything and run the doctest suite, on two cores (doctest itself is
#                   installed or fetched on first use: tests/get_doctest.sh)
#   make debug      the same programs at -O0 -g in build/debug (for gdb)
#   make sanitize   the library, door and fuzz suites (and the programs they run) under
#                   -fsanitize=address,undefined (build/asan)
#   make check-headers  each header compiles alone; block_pool.hpp, free_block_queue.hpp,
#                   prefix_index.hpp, prefix_cache.hpp, scheduler.hpp are plain C++; no
#                   reserved names defined
#   make check-clang  every source through clang++'s front end, -Werror (its warnings)
#   make bench      the CPU benchmark
#   make vs-runc    our generate against llama2.c's run.c -Ofast, whole runs on one thread,
#                   interleaved, median of 7 (tools/vs_runc.sh; needs llama2.c in build/llama2.c)
#   make cuda       every example and the test binary built by nvcc, in build/cuda
#                   (sm_90 = H100/H200, plus PTX for newer GPUs; override CUDA_ARCH);
#                   the HTTP server is `make cuda-serve`
#                   (make cuda-ci: only the sources with device code, as CI does)
#   make tsan       the kernel tests under ThreadSanitizer (emulated kernels), and
#                   build/serve under ThreadSanitizer with concurrent clients
#   make soak       build/serve under a long mixed load (2,000 requests with aborts, slow
#                   readers, a slowloris neighbour): /health fast, memory flat (also in make test)
#   make serve      build and start the HTTP server (examples/serve.cpp) on
#                   127.0.0.1:8000 (SERVE_ARGS="--port 9000 ..." to change)
#   make studies    every study (build/study) on the CPU and on the simulated GPU: tables on
#                   stdout, charts in build/plots/ (one: make study-thrash, study-victim, ...)
#   make plots      the charts lab/LAB.md shows, refreshed into lab/plots/
#   make check-docs every command listing in TUTORIAL.md, lab/LAB.md, README.md and COURSE.md re-run and compared
#                   with what is printed there (numbers marked ~ are timing and may differ)
#   make docs       re-run those listings and rewrite their output in place
#   make exercises  the course kit (COURSE.md): a student copy with every exercise cut, in
#                   build/course/exercises (make exercise N=3: only exercise 3)
#   make grade      grade this tree: the reference itself, or a student copy (a self-check;
#                   with PAGEDKV_REFERENCE set, a grade against it): one line per exercise as
#                   it finishes, the analysis questions, a total; exit 0 only if all pass.
#                   make grade N=3 (or N=3,4): only those exercises, no questions
#   make kit-selftest  the course kit proves itself: the reference passes, stubs, known-wrong
#                   implementations and cheats fail (tests/exercises/wrong/)
#   make clean

# Every core by default: a plain `make test` from a clean clone compiles the
# suites side by side. An explicit -jN (CI's -j2, or -j1 to read the log in
# order) wins.
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

BUILD    ?= build
OPT      ?= -O2
OPENMP   ?= 1
# -ffp-contract=off: never fuse a*b+c into one FMA behind our back. Fusing
# changes rounding, and we promise bit-identical results across paths.
CXXFLAGS ?= $(OPT) -std=c++20 -Wall -Wextra -Werror -ffp-contract=off
CXXFLAGS += -I.
ifeq ($(OPENMP),1)
CXXFLAGS += -fopenmp
else
CXXFLAGS += -Wno-unknown-pragmas
endif
SANFLAGS ?=
# A student copy (COURSE.md) has a .kit.mk that switches off the warnings its
# exercise stubs provoke (unused parameters); the reference has none.
-include .kit.mk
CXXFLAGS += $(KIT_CXXFLAGS)
CXXFLAGS += $(SANFLAGS)

# The HTTP example's own headers only rebuild what includes them; so do the
# viewer's (build/overload, build/serve and the viewer suite: see "the
# viewer's page" below).
HTTP_HEADERS := examples/openai_api.hpp examples/sse_client.hpp
VIEWER_HEADERS := examples/recorder.hpp examples/trace.hpp examples/viewer_page.hpp
HEADERS  := $(filter-out $(HTTP_HEADERS) $(VIEWER_HEADERS),$(wildcard *.cuh *.hpp core/*.hpp core/emu/*.hpp tiny_model/*.hpp tiny_model/*.cuh examples/*.hpp lab/*.hpp lab/*.cuh))
# The programs: examples/ (make run's demo, generate, kv_tour, ...) and lab/
# (benches, studies, the simulator's own programs). Both build to $(BUILD)/NAME.
EXAMPLES := $(patsubst examples/%.cpp,%,$(wildcard examples/*.cpp)) $(patsubst lab/%.cpp,%,$(wildcard lab/*.cpp))
# tools/: programs that work on the project itself (the docs checker, the
# course kit), built by the same rule as the examples.
TOOLS    := $(patsubst tools/%.cpp,%,$(wildcard tools/*.cpp))
TEST_SRCS := $(wildcard tests/*.cpp)
TEST_OBJS := $(patsubst tests/%.cpp,$(BUILD)/obj/tests/%.o,$(TEST_SRCS))
# The test suites build at -Og: under half of -O2's compile time, and gdb can
# step through them. The suites whose claims are about the optimized code
# (bit-identical logits on every SIMD level and thread split, llama2.c parity)
# or that run engines for seconds in their own process (the studies') build at
# $(OPT) like the programs, which always do. Any other OPT (the sanitizer and
# debug builds, `make OPT=...`) applies to every suite alike; nvcc builds set
# their own.
TEST_OPT   ?= $(if $(filter -O2,$(OPT)),-Og)
OPT_SUITES := test_model test_cpu_speed test_studies
# (by the object's name: $* would be a path in test_serve.o's own rule)
test_opt    = $(if $(filter $(OPT_SUITES),$(basename $(notdir $@))),,$(TEST_OPT))
# doctest comes from Debian's doctest-dev. When it is not installed,
# tests/get_doctest.sh installs it (as root) or unpacks the Debian package into
# build/deps/include (otherwise), which is always on the include path.
# DOCTEST_INC=dir uses dir/doctest/doctest.h instead.
DEPS        := build/deps
DOCTEST_INC ?=
CXXFLAGS += $(if $(DOCTEST_INC),-I$(DOCTEST_INC)) -isystem $(DEPS)/include
# The HTTP example (build/serve, build/loadgen, the serve suites) also needs
# Boost.Beast and Boost.Asio (the server), cpp-httplib (the clients) and
# nlohmann/json: tests/get_deps.sh installs them (as root) or unpacks the
# Debian packages into build/deps, and writes the flags Debian's build of
# cpp-httplib must be compiled and linked with into $(DEPS)/http.flags and
# $(DEPS)/http.libs (read when a recipe runs). Nothing else needs them: `make
# run` and every other program build without.
HTTP_PROGRAMS := serve loadgen
HTTP_CFLAGS   = $$(cat $(DEPS)/http.flags)
HTTP_LIBS     = $$(cat $(DEPS)/http.libs)

.PHONY: view view-png all run test debug sanitize tsan bench cuda studies plots clean check-doctest check-headers check-docs docs \
        exercises exercise grade kit-selftest vs-runc check-clang check-httpdeps serve tsan-serve soak
all: $(addprefix $(BUILD)/,$(EXAMPLES) $(TOOLS)) $(BUILD)/tests

$(BUILD)/%: examples/%.cpp $(HEADERS)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $< -o $@

$(BUILD)/%: lab/%.cpp $(HEADERS)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $< -o $@

# build/serve is Boost.Beast on Boost.Asio (header-only); build/loadgen a
# cpp-httplib client.
$(BUILD)/serve: examples/serve.cpp $(HEADERS) $(HTTP_HEADERS) | check-httpdeps
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $< -o $@ -pthread
$(BUILD)/loadgen: examples/loadgen.cpp $(HEADERS) $(HTTP_HEADERS) | check-httpdeps
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(HTTP_CFLAGS) $< -o $@ $(HTTP_LIBS)

$(BUILD)/%: tools/%.cpp $(HEADERS) $(wildcard tools/*.hpp)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $< -o $@

# (tests/serve_util.hpp is the serve suites' alone.)
TEST_HEADERS := $(filter-out tests/serve_util.hpp,$(wildcard tests/*.hpp))
$(BUILD)/obj/tests/%.o: tests/%.cpp $(HEADERS) $(TEST_HEADERS) | check-doctest
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(test_opt) -c $< -o $@

# The serve suites talk HTTP: they need the HTTP libraries too.
HTTP_TESTS := test_serve test_serve_edge test_viewer
$(patsubst %,$(BUILD)/obj/tests/%.o,$(HTTP_TESTS)): $(BUILD)/obj/tests/%.o: tests/%.cpp $(HEADERS) $(HTTP_HEADERS) $(wildcard tests/*.hpp) | check-doctest check-httpdeps
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(test_opt) $(HTTP_CFLAGS) -c $< -o $@

$(BUILD)/tests: $(TEST_OBJS) | check-httpdeps
	$(CXX) $(CXXFLAGS) $^ -o $@ $(HTTP_LIBS)

check-doctest:
	@$(if $(DOCTEST_INC),test -f $(DOCTEST_INC)/doctest/doctest.h,tests/get_doctest.sh $(DEPS))
check-httpdeps:
	@tests/get_deps.sh $(DEPS)

run: $(BUILD)/overload
	./$(BUILD)/overload

# The viewer (examples/viewer/, examples/recorder.hpp): make run's workload
# as one page and as a trace; overload says where they are.
view: $(BUILD)/overload
	./$(BUILD)/overload --no-lanes --view $(BUILD)/view.html --trace $(BUILD)/trace.json
# The picture of the page at the first preemption that the docs show
# (examples/viewer/first-preemption.png): the viewer's browser test takes it
# (build/viewer-2-first-preemption.png), this copies it.
view-png: $(BUILD)/tests $(BUILD)/overload
	./$(BUILD)/tests -ts=viewer -tc='*browser*'
	cp build/viewer-2-first-preemption.png examples/viewer/first-preemption.png

# The server, in the foreground (Ctrl-C stops it). `make run`'s cache: 40
# blocks of 16 tokens, so build/loadgen's default workload preempts.
SERVE_ARGS ?= --port 8000
serve: $(BUILD)/serve
	./$(BUILD)/serve $(SERVE_ARGS)

# The tests run the programs (llama2.c byte-for-byte check, the bad-input
# table, the flag fuzz), so everything is built first. The suite runs as two
# processes side by side, each a share of the test suites
# (tests/run_suite.sh); ./build/tests alone runs it in one.
test: all
	tests/run_suite.sh ./$(BUILD)/tests

# The soak alone (tests/test_serve_edge.cpp, suite "soak"; about 10 s here).
soak: $(BUILD)/tests $(BUILD)/serve
	./$(BUILD)/tests -ts=soak

bench: $(BUILD)/bench_cpu
	./$(BUILD)/bench_cpu

vs-runc:
	tools/vs_runc.sh 7

# Every study on both devices: tables on stdout, charts in build/plots/
# (never over tracked files). `make plots` refreshes the charts lab/LAB.md
# shows, in lab/plots/, from the simulated H200 + Llama-3-8B runs, and every
# study's map (a heat map of its verdicts over its grid: lab/study_map.hpp).
STUDY_NAMES := thrash admission victim preemption fixes shedding signals mechanisms kv_dtype
studies: $(BUILD)/study
	@mkdir -p build/plots
	@for s in $(STUDY_NAMES); do for d in cpu sim; do \
	  echo "== study $$s --device $$d"; ./$(BUILD)/study $$s --device $$d --svg build/plots/$$s-$$d.svg || exit 1; echo; done; done
study-%: $(BUILD)/study
	@mkdir -p build/plots
	./$(BUILD)/study $* --device cpu --svg build/plots/$*-cpu.svg
	./$(BUILD)/study $* --device sim --svg build/plots/$*-sim.svg
plots: $(BUILD)/study
	@mkdir -p lab/plots
	./$(BUILD)/study thrash --device sim --svg lab/plots/thrash-sim.svg > /dev/null
	@for s in $(STUDY_NAMES); do echo "== map of $$s"; \
	  ./$(BUILD)/study $$s --device sim --map --svg lab/plots/map-$$s.svg 2>/dev/null | grep ' holds in ' || exit 1; done

debug:
	$(MAKE) BUILD=build/debug OPT="-O0 -g" all

# ASan + UBSan over what needs them: the library (block pool, scheduler,
# engine, swap, the KV dtypes, misuse), the door (bad files, flags, requests:
# the bad-input table, run against the sanitized generate and overload) and
# the fuzz. The rest of the suite runs once, unsanitized, in `make test`.
# -O0: a third of -O1's compile time, and the same checks.
SAN_SUITES   := main test_paged_kv test_scheduler test_robustness test_bad_input test_swap test_kv_dtype
SAN_PROGRAMS := generate overload kv_tour
sanitize:
	$(MAKE) BUILD=build/asan OPT="-O0" OPENMP=0 SANFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	    $(addprefix build/asan/,$(SAN_PROGRAMS)) build/asan/san_tests
	./build/asan/san_tests

$(BUILD)/san_tests: $(patsubst %,$(BUILD)/obj/tests/%.o,$(SAN_SUITES))
	$(CXX) $(CXXFLAGS) $^ -o $@

# (examples/openai_api.hpp and examples/sse_client.hpp are the HTTP example's
# and include its libraries.)
check-headers: check-httpdeps
	tests/check_headers.sh $(CXX) $(if $(filter 1,$(OPENMP)),-fopenmp,-Wno-unknown-pragmas) -isystem $(DEPS)/include $(HTTP_CFLAGS)

# A second compiler's warnings: every source through clang++'s front end with
# -Werror. -fsyntax-only, because clang's warnings come from its front end
# (templates are instantiated there too); generating and linking code that
# `make test` already built with g++ would only cost time.
CLANG ?= clang++
check-clang: check-doctest check-httpdeps
	@ls examples/*.cpp lab/*.cpp tools/*.cpp tests/*.cpp | xargs -P 2 -I{} sh -c \
	    '$(CLANG) -fsyntax-only $(filter-out -fopenmp,$(CXXFLAGS)) -fopenmp $(HTTP_CFLAGS) {} || { echo "check-clang: {} failed"; exit 255; }'
	@echo "check-clang: $$(ls examples/*.cpp lab/*.cpp tools/*.cpp tests/*.cpp | wc -l) sources clean under $$($(CLANG) --version | head -n 1)"

# ThreadSanitizer over the emulated kernels: each CUDA thread is a fiber that
# TSan tracks like a thread, and a barrier is declared as the order it gives
# (core/emu/cuda_emulation.hpp), so a missing barrier is a data race TSan reports. Only the suites
# that launch kernels are built and run: kernels (tests/test_kernels.cpp,
# tests/test_gpu_gemm.cpp), kv_dtype and swap (the kernel path over f16/int8
# caches and through swap).
# -g1: line tables, which is all a TSan report prints (file:line of each
# access), at three quarters of -g's compile time.
tsan:
	$(MAKE) BUILD=build/tsan OPT="-O1 -g1" OPENMP=0 SANFLAGS="-fsanitize=thread" build/tsan/kernel_tests
	./build/tsan/kernel_tests -ts=kernels,kv_dtype,swap
	$(MAKE) tsan-serve

# The server's hand-over under ThreadSanitizer: build/tsan/serve and
# build/tsan/loadgen, a short run of concurrent streams with preemptions,
# disconnects, 429s and scrapes (tests/tsan_serve.sh); any report fails it.
tsan-serve:
	$(MAKE) BUILD=build/tsan OPT="-O1 -g1" OPENMP=0 SANFLAGS="-fsanitize=thread" build/tsan/serve build/tsan/loadgen
	tests/tsan_serve.sh build/tsan

$(BUILD)/kernel_tests: $(BUILD)/obj/tests/main.o $(BUILD)/obj/tests/test_kernels.o $(BUILD)/obj/tests/test_gpu_gemm.o \
                      $(BUILD)/obj/tests/test_kv_dtype.o $(BUILD)/obj/tests/test_swap.o
	$(CXX) $(CXXFLAGS) $^ -o $@

# The listings of TUTORIAL.md, lab/LAB.md, README.md and COURSE.md, re-run
# (tools/check_docs.cpp; every page's commands run at the repository root).
DOC_FILES := TUTORIAL.md lab/LAB.md README.md COURSE.md
check-docs: all
	./$(BUILD)/check_docs $(DOC_FILES)
docs: all
	./$(BUILD)/check_docs --update $(DOC_FILES)

# ---- the course kit (tools/kit.cpp, COURSE.md) ------------------------------
exercises: $(BUILD)/kit
	./$(BUILD)/kit cut --all --out build/course/exercises
exercise: $(BUILD)/kit
	@test -n "$(N)" || { echo "say which: make exercise N=3 (kit list shows them; make exercises cuts them all)"; exit 2; }
	./$(BUILD)/kit cut --exercises $(N) --out build/course/exercise-$(N)
grade: $(BUILD)/kit | check-doctest
	./$(BUILD)/kit grade $(if $(N),--exercises $(N) --no-questions)
kit-selftest: $(BUILD)/kit | check-doctest
	./$(BUILD)/kit selftest

# ---- nvcc --------------------------------------------------------------------
# --fmad=false: no fused multiply-add, so the GPU sums round like the CPU ones.
# CUDA_BUILD: the output folder (a second nvcc build beside build/cuda:
# `make CUDA_BUILD=build/mine-cuda cuda`; the bad-input tests treat a folder
# named "cuda" as a CUDA build). NVCC_WERROR: warnings are errors here, as in
# the CPU build; tests/gpu_check.sh empties it, because a warning from another
# host compiler on a GPU box must not cost the one run we get there.
NVCC        ?= nvcc
CUDA_BUILD  ?= build/cuda
NVCC_WERROR ?= -Xcompiler -Werror
CUDA_ARCH   ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCC_OPT    ?= -O2
NVCCFLAGS   ?= $(NVCC_OPT) -std=c++20 --fmad=false $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-ffp-contract=off,-fopenmp $(NVCC_WERROR) -I. \
               $(if $(DOCTEST_INC),-I$(DOCTEST_INC)) -isystem $(DEPS)/include
# The HTTP example and its test stay out of `make cuda`: a GPU machine's one
# run (tests/gpu_check.sh) must not depend on fetching packages. `make
# cuda-serve` builds the server with nvcc, for --device cuda.
CUDA_EXAMPLES  := $(filter-out $(HTTP_PROGRAMS),$(EXAMPLES))
CUDA_TEST_OBJS := $(patsubst tests/%.cpp,$(CUDA_BUILD)/obj/tests/%.o,$(filter-out $(patsubst %,tests/%.cpp,$(HTTP_TESTS)),$(TEST_SRCS)))

.PHONY: cuda-examples cuda-serve cuda-ci
# What CI builds with nvcc, having no GPU to run the rest on: the sources with
# device code of their own -- generate (the CUDA runner), bench_attention (both
# kernels) and the kernel suites, as a test binary of their own (kernel_tests,
# the suites `make tsan` runs). That is 7 of `make cuda`'s translation units;
# the others' host code is what g++ builds in `make test`. `make cuda` builds
# everything, as tests/gpu_check.sh does on a GPU. CI, which runs none of it on
# a GPU, also drops the PTX and the host optimizer (.ci/run: a quarter less).
cuda-ci: $(CUDA_BUILD)/generate $(CUDA_BUILD)/bench_attention $(CUDA_BUILD)/kernel_tests
$(CUDA_BUILD)/kernel_tests: $(patsubst %,$(CUDA_BUILD)/obj/tests/%.o,main test_kernels test_gpu_gemm test_kv_dtype test_swap)
	$(NVCC) $(CUDA_ARCH) $^ -o $@ -lgomp

cuda: $(addprefix $(CUDA_BUILD)/,$(CUDA_EXAMPLES)) $(CUDA_BUILD)/tests
# Only the programs, no doctest needed (gpu_check.sh, where doctest is absent).
cuda-examples: $(addprefix $(CUDA_BUILD)/,$(CUDA_EXAMPLES))

$(CUDA_BUILD)/%: examples/%.cpp $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -x cu $< -o $@ -lgomp

$(CUDA_BUILD)/%: lab/%.cpp $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -x cu $< -o $@ -lgomp

# nvcc's front end (CUDA 13) cannot parse Asio's variable templates and
# concepts, nor Beast's use of std::source_location: the three macros make
# Boost use its plainer forms of the same (error codes then carry no source
# line). -pthread goes on to the host compiler.
BOOST_NVCC_FLAGS := -DBOOST_ASIO_DISABLE_VARIABLE_TEMPLATES -DBOOST_ASIO_DISABLE_CONCEPTS -DBOOST_DISABLE_CURRENT_LOCATION
cuda-serve: $(CUDA_BUILD)/serve
$(CUDA_BUILD)/serve: examples/serve.cpp $(HEADERS) $(HTTP_HEADERS) | check-httpdeps
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(BOOST_NVCC_FLAGS) -x cu $< -o $@ -lgomp -Xcompiler -pthread

$(CUDA_BUILD)/obj/tests/%.o: tests/%.cpp $(HEADERS) $(wildcard tests/*.hpp) | check-doctest
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -x cu -c $< -o $@

$(CUDA_BUILD)/tests: $(CUDA_TEST_OBJS)
	$(NVCC) $(CUDA_ARCH) $^ -o $@ -lgomp

# ---- the viewer's page ---------------------------------------------------------
# Its files become C++ constants (examples/viewer/embed.sh) that build/overload
# and build/serve carry (examples/viewer_page.hpp): no file is looked up at run
# time. The header goes to build/gen/ whatever BUILD is.
VIEWER_FILES  := examples/viewer/viewer.html examples/viewer/viewer.css examples/viewer/viewer.js
VIEWER_ASSETS := build/gen/viewer_assets.hpp
$(VIEWER_ASSETS): $(VIEWER_FILES) examples/viewer/embed.sh
	examples/viewer/embed.sh $@ $(VIEWER_FILES)
$(BUILD)/overload $(BUILD)/serve $(CUDA_BUILD)/overload $(CUDA_BUILD)/serve: $(VIEWER_HEADERS) $(VIEWER_ASSETS)
$(BUILD)/obj/tests/test_viewer.o: $(VIEWER_HEADERS)
check-clang: $(VIEWER_ASSETS)

clean:
	rm -rf build
