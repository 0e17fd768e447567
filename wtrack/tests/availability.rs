//! Whether tracking is available is a property of the kernel, and must not depend on what the
//! caller already follows. (A file of its own: `available` answers once per process.)

use std::ops::Range;

use kreplay_wtrack::{WriteTracker, available, private_anonymous_cover};

/// The mapping of `/proc/self/maps` that holds `addr`.
fn mapping_of(addr: usize) -> Range<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|line| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            Some(usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?)
        })
        .find(|r| r.contains(&addr))
        .expect("a heap address is mapped")
}

/// An application that follows its whole malloc heap (a software device whose memory comes
/// from `malloc`) and only then asks whether tracking is available.
#[test]
fn tracking_stays_available_while_the_callers_tracker_follows_the_malloc_heap() {
    // Room the allocator hands out again: a small block freed inside the heap followed below.
    let block = vec![1u8; 64 << 10];
    let heap = mapping_of(block.as_ptr() as usize);
    drop(block);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mappings: Vec<_> = maps
        .lines()
        .filter_map(kreplay_wtrack::Mapping::parse)
        .collect();
    if let Err(why) = private_anonymous_cover(&mappings, heap.clone()) {
        eprintln!("skipped: the heap here is not followable: {why}");
        return;
    }
    let tracker = match WriteTracker::new(std::slice::from_ref(&heap)) {
        Ok(tracker) => tracker,
        Err(e) => {
            eprintln!("skipped: write tracking is not available here: {e}");
            return;
        }
    };
    let answer = available();
    drop(tracker);
    assert_eq!(answer, Ok(()));
}
