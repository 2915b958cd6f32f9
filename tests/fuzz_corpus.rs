//! Replays every file of fuzz/corpus/<target>/ through its target on stable, so findings kept
//! there (and the seeds) stay covered by the regular suite.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "{} fails", path.display());
        n += 1;
    }
    assert!(n > 0, "empty corpus for {target}");
}

#[test]
fn request_head_corpus() {
    replay("request_head", ringway::fuzzing::request_head);
}

#[test]
fn response_head_corpus() {
    replay("response_head", ringway::fuzzing::response_head);
}

#[test]
fn chunked_corpus() {
    replay("chunked", ringway::fuzzing::chunked);
}

#[test]
fn config_corpus() {
    replay("config", ringway::fuzzing::config);
}
