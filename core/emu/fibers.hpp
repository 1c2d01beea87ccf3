// core/emu/fibers.hpp -- the CUDA emulator, part 3 (skip on a first reading; TUTORIAL appendix
// A): the machinery under the emulated launch: many stacks, one CPU thread.
//
// cuda_emulation.hpp runs a thread block's CUDA threads as *fibers*: each has
// its own stack, all of them run on the host thread that called launch(), one
// at a time, and a fiber gives up the CPU only where a CUDA thread would wait
// for others (a barrier, a shuffle). That header says why, and how a block
// runs; this one holds the three low-level pieces it stands on, none of which
// knows anything about CUDA:
//
//   1. switching stacks: save the registers a callee must preserve and the
//      stack pointer, load another fiber's -- no system call;
//   2. fiber stacks: one mapping per fiber, with a guard page below it;
//   3. telling the sanitizers: ThreadSanitizer and AddressSanitizer must know
//      about every switch, or they see one thread running everything.
//
// A reader who wants the emulated GPU's behaviour can skip this file: it is
// the same idea as any coroutine library, written out so that gdb, TSan and
// ASan all keep working and nothing comes from outside the standard library.
#pragma once
#ifdef __CUDACC__
#error "cuda_emulation.hpp is the CPU stand-in for a GPU; under nvcc include cuda_shim.hpp"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

// Which stack switch (section 1): our own on x86-64, the C library's
// ucontext elsewhere, or on request (-DPKV_EMU_UCONTEXT, to test the fallback),
// or where the CPU's shadow stack may be on (__CET__ bit 2: a return to
// another stack than the one the call came from would fault; glibc's
// swapcontext knows how to switch the shadow stack too).
#if defined(__x86_64__) && !defined(PKV_EMU_UCONTEXT) && !(defined(__CET__) && (__CET__ & 2))
#define PKV_EMU_ASM_SWITCH 1
#else
#define PKV_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

// Which sanitizer watches us (section 3). GCC says so with __SANITIZE_*__,
// clang with __has_feature.
#if defined(__SANITIZE_THREAD__)
#define PKV_EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PKV_EMU_ASAN 1
#endif
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(PKV_EMU_TSAN)
#define PKV_EMU_TSAN 1
#endif
#if __has_feature(address_sanitizer) && !defined(PKV_EMU_ASAN)
#define PKV_EMU_ASAN 1
#endif
#endif
#ifdef PKV_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#ifdef PKV_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// ============================================================================
// 1. Switching stacks
// ============================================================================
//
// A fiber is suspended in the middle of a function, with that function's
// callers below it on the fiber's own stack. To suspend it we need to keep
// exactly what the function-call convention says a callee must give back to
// its caller -- on x86-64 (System V) the registers rbx, rbp, r12 to r15 and
// the stack pointer -- because every other register is already assumed lost
// across a call. pkv_emu_switch(&save, load) pushes those onto the current
// stack, stores the stack pointer in *save, loads the stack pointer `load`
// (which another pkv_emu_switch stored), pops that fiber's registers and
// returns: into the other fiber, at the point where it once called
// pkv_emu_switch. That is the whole context switch, fifteen instructions.
//
// The ABI also counts the floating-point control words (rounding mode,
// flush-to-zero) as callee-saved, and a general-purpose switch (swapcontext,
// boost.context) saves them too. We do not: all fibers of a host thread share
// its floating-point environment, as the threads of a GPU share the one their
// instructions encode (a kernel cannot change a rounding mode), and saving and
// reloading those two words took most of the switch's time when we measured.
//
// A new fiber's stack is prepared to look as if it had called pkv_emu_switch
// from pkv_emu_start (fiber_stack_init, below): the first switch to it "returns"
// into pkv_emu_start, which calls the entry function whose address the stack
// holds in rbx's slot. The directive `.cfi_undefined rip` says that
// pkv_emu_start has no caller, so gdb's backtrace and the C++ unwinder stop
// there instead of reading past the top of the stack.
//
// The code sits in a comdat section with weak symbols, like the code of an
// inline function: every file that includes this header emits a copy and the
// linker keeps one.
#if PKV_EMU_ASM_SWITCH
extern "C" {
__attribute__((visibility("hidden"))) void pkv_emu_switch(void** save_sp, void* load_sp);
__attribute__((visibility("hidden"))) void pkv_emu_start();
}
asm(R"(
    .pushsection .text.pkv_emu_switch,"axG",@progbits,pkv_emu_switch,comdat
    .weak pkv_emu_switch
    .hidden pkv_emu_switch
    .type pkv_emu_switch, @function
    .p2align 4
pkv_emu_switch:
    .cfi_startproc
    pushq %rbp
    .cfi_adjust_cfa_offset 8
    pushq %rbx
    .cfi_adjust_cfa_offset 8
    pushq %r12
    .cfi_adjust_cfa_offset 8
    pushq %r13
    .cfi_adjust_cfa_offset 8
    pushq %r14
    .cfi_adjust_cfa_offset 8
    pushq %r15
    .cfi_adjust_cfa_offset 8
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    .cfi_adjust_cfa_offset -8
    popq %r14
    .cfi_adjust_cfa_offset -8
    popq %r13
    .cfi_adjust_cfa_offset -8
    popq %r12
    .cfi_adjust_cfa_offset -8
    popq %rbx
    .cfi_adjust_cfa_offset -8
    popq %rbp
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size pkv_emu_switch, .-pkv_emu_switch

    .weak pkv_emu_start
    .hidden pkv_emu_start
    .type pkv_emu_start, @function
    .p2align 4
pkv_emu_start:
    .cfi_startproc
    .cfi_undefined rip
    callq *%rbx
    ud2
    .cfi_endproc
    .size pkv_emu_start, .-pkv_emu_start
    .popsection
)");
#endif

namespace pkv::emu {

// What cuda_emulation.hpp needs from section 1: a Context is a suspended
// fiber (or the host thread while a fiber runs); context_init makes a new one
// that will run entry() on the given stack; context_switch suspends `from`
// and resumes `to`.
#if PKV_EMU_ASM_SWITCH
struct Context {
    void* sp = nullptr;  // the stack pointer pkv_emu_switch saved
};
inline void context_init(Context& c, unsigned char* stack_lo, size_t stack_bytes, void (*entry)()) {
    // The 7 slots pkv_emu_switch pops, lowest first: r15, r14, r13, r12,
    // rbx (= entry), rbp (= 0: the end of the frame chain, for unwinders that
    // follow frame pointers), the return address (pkv_emu_start). The top is
    // 16-byte aligned and pkv_emu_start is entered with rsp 16-byte aligned
    // (top - 16), so its call gives entry() the alignment the ABI promises.
    const uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + stack_bytes) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top - 16 - 7 * sizeof(void*));
    std::memset(sp, 0, 7 * sizeof(void*));
    sp[4] = reinterpret_cast<void*>(entry);
    sp[6] = reinterpret_cast<void*>(&pkv_emu_start);
    c.sp = sp;
}
inline void context_switch(Context& from, Context& to) { pkv_emu_switch(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};
inline void context_init(Context& c, unsigned char* stack_lo, size_t stack_bytes, void (*entry)()) {
    if (getcontext(&c.uc) != 0) throw std::runtime_error("launch: getcontext failed for an emulated thread");
    c.uc.uc_stack.ss_sp = stack_lo;
    c.uc.uc_stack.ss_size = stack_bytes;
    c.uc.uc_link = nullptr;  // entry() never returns
    makecontext(&c.uc, entry, 0);
}
inline void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ============================================================================
// 2. Fiber stacks
// ============================================================================
//
// Each fiber gets 256 KiB of address space, mapped with MAP_NORESERVE: the
// kernel gives it memory only for the pages a fiber touches (a few KiB for
// our kernels, more at -O0 or under a sanitizer), so even 1024 fibers cost
// little. Below each stack is one page mapped with no access at all: a fiber
// that overflows its stack faults there (SIGSEGV, which gdb shows in the
// kernel's deepest frame) instead of silently overwriting its neighbour.
constexpr size_t kFiberStackBytes = 256 * 1024;

class FiberStack {
public:
    FiberStack() {
        page_ = (size_t)sysconf(_SC_PAGESIZE);
        void* p = mmap(nullptr, kFiberStackBytes + page_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED) throw std::runtime_error("launch: cannot map a stack for an emulated CUDA thread (mmap failed)");
        base_ = static_cast<unsigned char*>(p);
        mprotect(base_, page_, PROT_NONE);  // the guard page (a failure only loses the guard)
    }
    FiberStack(const FiberStack&) = delete;
    FiberStack& operator=(const FiberStack&) = delete;
    ~FiberStack() {
#ifdef PKV_EMU_ASAN
        // A suspended fiber leaves its frames' red zones poisoned in ASan's
        // shadow memory; the next mapping at these addresses must not inherit them.
        ASAN_UNPOISON_MEMORY_REGION(lo(), kFiberStackBytes);
#endif
        munmap(base_, kFiberStackBytes + page_);
    }
    unsigned char* lo() const { return base_ + page_; }  // the lowest usable byte
    static constexpr size_t size() { return kFiberStackBytes; }

private:
    unsigned char* base_ = nullptr;  // [page_ guard bytes, kFiberStackBytes stack bytes]
    size_t page_ = 4096;
};

// ============================================================================
// 3. Telling the sanitizers
// ============================================================================
//
// ThreadSanitizer keeps a vector clock per thread and reports two accesses
// to the same memory, at least one a write, when neither happens before the
// other. Fibers are not threads, so on its own TSan would see one thread
// running everything in program order: no race, ever. Its fiber interface
// fixes that. We give each fiber its own TSan context (__tsan_create_fiber),
// and before every switch we tell TSan which context runs next
// (__tsan_switch_to_fiber) with the flag that says "this switch orders
// nothing". The orders that do exist, we declare where they arise:
//
//   - a barrier: every arriving fiber releases the barrier's sync address,
//     every departing fiber acquires it (__tsan_release / __tsan_acquire), so
//     everything a thread did before the barrier happens before everything
//     any thread does after it -- what syncthreads() promises, no more;
//   - a launch's start and end: the host's writes before a launch happen
//     before every thread's start (launch arguments, uploads), and every
//     thread's end happens before the host goes on after the launch (reading
//     results). Between the blocks of one launch we declare an order only
//     where the host needs one, to refill shared memory; otherwise blocks stay
//     as unordered as on a GPU, where they may run at the same time.
//
// The scheduler's own bookkeeping (who waits where, which fiber runs, the
// built-ins it writes for each fiber) is shared by all fibers without any such
// order: deliberately, since it all runs on one host thread. Those functions
// are compiled without TSan's instrumentation (PKV_EMU_UNTRACKED), so TSan
// neither reports them nor, more importantly, lets them hide a race in a kernel.
//
// AddressSanitizer needs less: it must know which stack is current, to
// unpoison the right range when an exception unwinds and to tell a stack
// address from a heap one. __sanitizer_start_switch_fiber (just before a
// switch, naming the stack we go to) and __sanitizer_finish_switch_fiber (just
// after, which also tells us the stack we came from) keep it informed.
#ifdef PKV_EMU_TSAN
#define PKV_EMU_UNTRACKED __attribute__((no_sanitize("thread")))
inline void tsan_release(void* addr) { __tsan_release(addr); }
inline void tsan_acquire(void* addr) { __tsan_acquire(addr); }
#else
#define PKV_EMU_UNTRACKED
inline void tsan_release(void*) {}
inline void tsan_acquire(void*) {}
#endif

// The stack a fiber runs on, in the form ASan's fiber calls want.
struct StackRange {
    const void* lo = nullptr;
    size_t size = 0;
};
inline void asan_start_switch([[maybe_unused]] void** fake_stack, [[maybe_unused]] StackRange to) {
#ifdef PKV_EMU_ASAN
    __sanitizer_start_switch_fiber(fake_stack, to.lo, to.size);
#endif
}
inline void asan_finish_switch([[maybe_unused]] void* fake_stack, [[maybe_unused]] StackRange* from) {
#ifdef PKV_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, from ? &from->lo : nullptr, from ? &from->size : nullptr);
#endif
}
}  // namespace pkv::emu
