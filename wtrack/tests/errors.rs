//! What an error says: the address it is about and why, in words a caller can act on.

use kreplay_wtrack::{Mapping, private_anonymous_cover};

/// The main thread's stack is private, writable and has no file: refused, but not as
/// file-backed memory, which it is not.
#[test]
fn the_stack_is_refused_as_the_stack_not_as_a_file() {
    let maps: Vec<Mapping> = [
        "7ffd1000-7ffd3000 rw-p 00000000 00:00 0 [stack]",
        "7ffd3000-7ffd4000 rw-p 00000000 00:00 0",
    ]
    .into_iter()
    .filter_map(Mapping::parse)
    .collect();
    let why = private_anonymous_cover(&maps, 0x7ffd2000..0x7ffd4000).unwrap_err();
    assert!(
        why.contains("[stack]") && !why.contains("file-backed"),
        "{why}"
    );
}
