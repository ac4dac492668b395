//! The global allocator of every warden process: mimalloc, with a count of the heap bytes in
//! use that a measurement can switch on.
//!
//! mimalloc instead of glibc's malloc: allocation and free were about 17% of a loaded
//! `warden dev`'s CPU under glibc (docs/benchmarks.md, the profile of `make compare`); mimalloc's per-thread free lists
//! make the many small, short-lived buffers of the request path cheaper. A release build of
//! mimalloc keeps no count of live bytes (its "committed" figure grows by whole arenas, so a
//! few thousand small allocations read as nothing), hence the count here. Off, it costs one
//! relaxed load of a flag per call; `warden bench watch` switches it on before anything else
//! runs, so every byte it frees was counted when it was allocated.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// mimalloc, counting the bytes in use while [`count_from_now`] is in force.
pub struct Allocator;

/// Whether allocations are counted (set once, at the start of a measuring process).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Bytes allocated less bytes freed since counting began (negative only when memory
/// allocated before it began is freed).
static IN_USE_BYTES: AtomicI64 = AtomicI64::new(0);

fn counted(delta: i64) {
    if COUNTING.load(Ordering::Relaxed) {
        IN_USE_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to mimalloc with the caller's own arguments; the count
// changes nothing about the memory handed out.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller keeps GlobalAlloc::alloc's contract, which MiMalloc's has too.
        let memory = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !memory.is_null() {
            counted(layout.size() as i64);
        }
        memory
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let memory = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !memory.is_null() {
            counted(layout.size() as i64);
        }
        memory
    }

    unsafe fn dealloc(&self, memory: *mut u8, layout: Layout) {
        // SAFETY: `memory` came from this allocator with `layout` (the caller's contract).
        unsafe { mimalloc::MiMalloc.dealloc(memory, layout) };
        counted(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, memory: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` keeps GlobalAlloc::realloc's contract.
        let moved = unsafe { mimalloc::MiMalloc.realloc(memory, layout, new_size) };
        if !moved.is_null() {
            counted(new_size as i64 - layout.size() as i64);
        }
        moved
    }
}

/// Counts every allocation and free from now on. Call it before the work to be measured
/// starts allocating (first thing in `main`), so what that work frees was counted.
pub fn count_from_now() {
    COUNTING.store(true, Ordering::SeqCst);
}

/// Heap bytes in use by the process as counted since [`count_from_now`]; `None` when
/// counting is off (nothing to read).
pub fn in_use_bytes() -> Option<i64> {
    COUNTING.load(Ordering::SeqCst).then(|| IN_USE_BYTES.load(Ordering::SeqCst))
}
