// core/free_block_queue.hpp -- chapter 1: the free list, a queue that a block
// can leave from the middle.
//
// The block pool (core/block_pool.hpp) keeps its free blocks in one queue, in
// eviction order. With prefix caching a free block may still hold K/V that a
// new request wants, and that request takes it out of the *middle* of the
// queue. That must cost O(1), not a scan of the list.
//
// So the queue is a doubly linked list of block ids, its links kept per block
// in one array: no allocation after construction, no pointers (a copied pool
// stays valid), and a block's place is found from its id alone. vLLM's
// FreeKVCacheBlockQueue (kv_cache_utils.py) is the same list, its links kept
// in each KVCacheBlock object.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace pkv {

class FreeBlockQueue {
public:
    FreeBlockQueue() = default;
    explicit FreeBlockQueue(int num_blocks) : links_((size_t)(num_blocks > 0 ? num_blocks : 0)) {}

    int size() const { return size_; }
    int32_t front() const { return head_; }  // -1 when empty
    int32_t back() const { return tail_; }   // -1 when empty
    // The neighbours of block b in the queue, -1 past either end.
    int32_t next(int32_t b) const { return at(b).next; }
    int32_t prev(int32_t b) const { return at(b).prev; }
    bool contains(int32_t b) const { return at(b).in_queue; }

    void push_back(int32_t b) { insert(b, tail_, -1); }
    void push_front(int32_t b) { insert(b, -1, head_); }

    // Take b out from wherever it stands, with no search: b's own links name
    // both neighbours, which is the whole point of the list.
    void remove(int32_t b) {
        Links& l = at(b);
        if (!l.in_queue) throw std::logic_error("FreeBlockQueue::remove: block " + std::to_string(b) + " is not in the queue");
        // Each line picks the one link that pointed at b -- a neighbour's, or
        // the queue's own end when b stood there -- and points it past b.
        (l.prev != -1 ? links_[(size_t)l.prev].next : head_) = l.next;
        (l.next != -1 ? links_[(size_t)l.next].prev : tail_) = l.prev;
        l = Links{};
        --size_;
    }

private:
    struct Links {
        int32_t prev = -1, next = -1;  // block ids; -1 at the ends or when out of the queue
        bool in_queue = false;
    };

    // Link b between `prev` and `next` (neighbours, or -1 for an end):
    // push_back is insert(b, back, -1), push_front insert(b, -1, front).
    void insert(int32_t b, int32_t prev, int32_t next) {
        Links& l = at(b);
        // A block freed twice would otherwise be linked twice and the list
        // would lose its shape; the pool refuses double frees before this.
        if (l.in_queue) throw std::logic_error("FreeBlockQueue: block " + std::to_string(b) + " is already in the queue");
        l = Links{prev, next, true};
        // The two links that now point at b: prev's next (or the head, when b
        // goes first) and next's prev (or the tail, when b goes last).
        (prev != -1 ? links_[(size_t)prev].next : head_) = b;
        (next != -1 ? links_[(size_t)next].prev : tail_) = b;
        ++size_;
    }
    const Links& at(int32_t b) const {
        if (b < 0 || (size_t)b >= links_.size())
            throw std::out_of_range("FreeBlockQueue: block id " + std::to_string(b) + " is not in 0.." +
                                    std::to_string((int64_t)links_.size() - 1));
        return links_[(size_t)b];
    }
    Links& at(int32_t b) { return const_cast<Links&>(static_cast<const FreeBlockQueue&>(*this).at(b)); }  // the same, writable

    std::vector<Links> links_;  // [num_blocks] each block's place in the queue
    int32_t head_ = -1, tail_ = -1;
    int size_ = 0;
};

}  // namespace pkv
