//! A refused `OnLoad` is reported through kreplay's logging (the `log` facade, target
//! `kreplay`, as an error) like every other diagnostic: a Rust host's logger receives it, and a
//! C host gets kreplay's stderr sink, where `KREPLAY_LOG` decides (errors print at every level
//! but `off`).

mod captured;

#[test]
fn a_refused_onload_is_an_error_through_kreplays_logging() {
    captured::install();

    // SAFETY: a null table is one of the inputs OnLoad must refuse; no tool names are passed.
    let loaded = unsafe { kreplay::hsa_tool::OnLoad(std::ptr::null_mut(), 0, 0, std::ptr::null()) };
    assert!(!loaded, "a null table is refused");

    let seen = captured::records();
    let errors: Vec<&(log::Level, String, String)> = seen
        .iter()
        .filter(|(level, target, _)| *level == log::Level::Error && target == "kreplay")
        .collect();
    assert_eq!(errors.len(), 1, "{seen:?}");
    assert!(errors[0].2.starts_with("not loaded: "), "{seen:?}");
}
