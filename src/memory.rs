//! The VM's memory allocator: size classes for small blocks, the system
//! allocator (wasi-libc's dlmalloc) for the rest.
//!
//! A request makes a few hundred small allocations (header pairs, strings,
//! JSON nodes) and frees them all by the end; `make bench` showed malloc and
//! free taking about a quarter of the filter's time in wasm. Here a small
//! block is popped from, and pushed back onto, a free list per size class:
//! a dozen instructions each way. Blocks are carved from 64 KiB slabs taken
//! from the system allocator and are never given back, which costs nothing
//! extra in a wasm VM: its linear memory never shrinks anyway.
//!
//! It assumes one thread, which wasm32-wasip1 guarantees (a VM has no
//! threads); the shell installs it only there. Natively it is exercised by
//! the tests below as a plain value.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::{copy_nonoverlapping, null_mut};

/// Block sizes; every one a multiple of [`ALIGN`]. Steps of about 1.5x keep
/// the space lost to rounding under a third.
const CLASSES: [usize; 16] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
];
/// The largest size served from a class.
const LARGEST: usize = 4096;
/// The alignment every block has.
const ALIGN: usize = 16;
const SLAB: usize = 64 * 1024;

/// The class of each size, by `size.div_ceil(16)`.
const CLASS_OF: [u8; LARGEST / ALIGN + 1] = class_table();

// Evaluated at compile time only: an index out of bounds fails the build.
#[allow(clippy::indexing_slicing)]
const fn class_table() -> [u8; LARGEST / ALIGN + 1] {
    let mut table = [0u8; LARGEST / ALIGN + 1];
    let mut units = 0;
    let mut class = 0;
    while units < table.len() {
        while CLASSES[class] < units * ALIGN {
            class += 1;
        }
        table[units] = class as u8;
        units += 1;
    }
    table
}

/// The class serving `layout`, if a class does.
fn class_of(layout: Layout) -> Option<usize> {
    if layout.align() > ALIGN {
        return None;
    }
    CLASS_OF.get(layout.size().div_ceil(ALIGN)).map(|c| usize::from(*c))
}

struct Pools {
    /// Per class, the first free block; each free block starts with a
    /// pointer to the next.
    free: [*mut u8; CLASSES.len()],
    /// The unused rest of the current slab.
    bump: *mut u8,
    end: *mut u8,
}

/// The allocator; see the module documentation.
pub struct SizeClasses(UnsafeCell<Pools>);

// SAFETY: used from one thread only (see the module documentation).
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    pub const fn new() -> SizeClasses {
        SizeClasses(UnsafeCell::new(Pools {
            free: [null_mut(); CLASSES.len()],
            bump: null_mut(),
            end: null_mut(),
        }))
    }

    /// A block of class `class`: the first free one, else carved from the slab.
    unsafe fn take(&self, class: usize) -> *mut u8 {
        // SAFETY: one thread, and no reference into the pools outlives this call.
        let pools = unsafe { &mut *self.0.get() };
        let Some(head) = pools.free.get_mut(class) else {
            return null_mut();
        };
        if !head.is_null() {
            let block = *head;
            // SAFETY: a free block of this class holds the next free block's address.
            *head = unsafe { block.cast::<*mut u8>().read() };
            return block;
        }
        let Some(&size) = CLASSES.get(class) else {
            return null_mut();
        };
        if (pools.end as usize).saturating_sub(pools.bump as usize) < size {
            // SAFETY: a non-zero size and a valid power-of-two alignment.
            let slab = unsafe { System.alloc(Layout::from_size_align_unchecked(SLAB, ALIGN)) };
            if slab.is_null() {
                return null_mut();
            }
            // The old slab's tail (under one block) is left unused.
            pools.bump = slab;
            // SAFETY: one past the end of the slab just allocated.
            pools.end = unsafe { slab.add(SLAB) };
        }
        let block = pools.bump;
        // SAFETY: `size` bytes remain in the slab.
        pools.bump = unsafe { block.add(size) };
        block
    }

    /// Puts a block of class `class` back on its free list.
    unsafe fn give(&self, block: *mut u8, class: usize) {
        // SAFETY: one thread, and no reference into the pools outlives this call.
        let pools = unsafe { &mut *self.0.get() };
        if let Some(head) = pools.free.get_mut(class) {
            // SAFETY: the block is ours again and at least 16 bytes, aligned.
            unsafe { block.cast::<*mut u8>().write(*head) };
            *head = block;
        }
    }
}

impl Default for SizeClasses {
    fn default() -> Self {
        SizeClasses::new()
    }
}

// SAFETY: blocks are aligned to 16 and at least as large as asked (CLASSES
// are multiples of 16, slabs are 16-aligned); a block is handed out once
// until freed; everything else goes to the system allocator with its layout.
unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            // SAFETY: see the impl.
            Some(class) => unsafe { self.take(class) },
            // SAFETY: the caller's layout, passed on.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match class_of(layout) {
            // SAFETY: allocated with this layout, so from this class.
            Some(class) => unsafe { self.give(ptr, class) },
            // SAFETY: allocated by the system allocator with this layout.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees new_size is valid for this alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new_layout)) {
            // The block already has room.
            (Some(old), Some(new)) if old == new => ptr,
            // SAFETY: both from the system allocator.
            (None, None) => unsafe { System.realloc(ptr, layout, new_size) },
            _ => {
                // SAFETY: a fresh block for the new layout, then a copy of
                // what both blocks hold, then the old block freed.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_gets_the_smallest_class_that_holds_it() {
        for size in 0..=LARGEST {
            let class = class_of(Layout::from_size_align(size, 1).unwrap()).unwrap();
            assert!(CLASSES[class] >= size, "{size}");
            assert!(class == 0 || CLASSES[class - 1] < size, "{size}");
        }
        assert_eq!(class_of(Layout::from_size_align(LARGEST + 1, 1).unwrap()), None);
        assert_eq!(class_of(Layout::from_size_align(8, 32).unwrap()), None);
    }

    #[test]
    fn blocks_are_aligned_distinct_and_reused() {
        let a = SizeClasses::new();
        let sizes = [1usize, 7, 16, 17, 100, 500, 2048, 4000, 5000, 70_000, 24, 3];
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        for round in 0..3u8 {
            for (i, size) in sizes.iter().enumerate() {
                let layout = Layout::from_size_align(*size, if i % 2 == 0 { 8 } else { 1 }).unwrap();
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null());
                assert_eq!(p as usize % layout.align(), 0);
                let tag = round.wrapping_mul(31).wrapping_add(i as u8);
                unsafe { p.write_bytes(tag, *size) };
                live.push((p, layout, tag));
            }
            // Every live block still holds what was written: none overlap.
            for (p, layout, tag) in &live {
                let bytes = unsafe { std::slice::from_raw_parts(*p, layout.size()) };
                assert!(bytes.iter().all(|b| b == tag));
            }
            // Free every other one; the next round reuses them.
            let mut keep = Vec::new();
            for (n, (p, layout, tag)) in live.drain(..).enumerate() {
                if n % 2 == 0 {
                    unsafe { a.dealloc(p, layout) };
                } else {
                    keep.push((p, layout, tag));
                }
            }
            live = keep;
        }
        let layout = Layout::from_size_align(40, 1).unwrap();
        let p = unsafe { a.alloc(layout) };
        unsafe { a.dealloc(p, layout) };
        assert_eq!(unsafe { a.alloc(layout) }, p, "a freed block is handed out again");
    }

    #[test]
    fn realloc_keeps_the_contents_across_classes_and_the_system() {
        let a = SizeClasses::new();
        let mut layout = Layout::from_size_align(5, 1).unwrap();
        let mut p = unsafe { a.alloc(layout) };
        unsafe { p.copy_from_nonoverlapping(b"hello".as_ptr(), 5) };
        for new_size in [9usize, 16, 100, 3000, 10_000, 200_000, 6000, 50, 5] {
            p = unsafe { a.realloc(p, layout, new_size) };
            assert!(!p.is_null());
            layout = Layout::from_size_align(new_size, 1).unwrap();
            assert_eq!(unsafe { std::slice::from_raw_parts(p, 5) }, b"hello", "{new_size}");
        }
        unsafe { a.dealloc(p, layout) };
    }
}
