//! Replays the committed fuzz corpora (`fuzz/corpus/TARGET`, grown and minimised by
//! `scripts/fuzz.sh`) through the same entry points the fuzz targets call, so every input a
//! fuzzer once found interesting, crashes that were fixed included, stays checked by plain
//! `cargo test`: no panic, and each target's invariants hold.

use std::path::Path;

/// Runs every file of `fuzz/corpus/TARGET` and `fuzz/regressions/TARGET` (inputs that once
/// failed, kept apart so minimising the corpus never drops them).
fn replay(target: &str, run: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in [
        fuzz.join("corpus").join(target),
        fuzz.join("regressions").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let result = std::panic::catch_unwind(|| run(&data));
            assert!(result.is_ok(), "{target}: {} fails", path.display());
            count += 1;
        }
    }
    assert!(count >= 3, "{target}: only {count} corpus inputs");
}

#[test]
fn config() {
    replay("config", haptic::fuzzing::config);
}

#[test]
fn duration() {
    replay("duration", haptic::fuzzing::duration);
}

#[test]
fn haproxy_cfg() {
    replay("haproxy_cfg", haptic::fuzzing::haproxy_cfg);
}

#[test]
fn watch_stream() {
    replay("watch_stream", haptic::fuzzing::watch_stream);
}

#[test]
fn store_paths() {
    replay("store_paths", haptic::fuzzing::store_paths);
}

#[test]
fn http_request() {
    replay("http_request", haptic_agent::fuzzing::http_request);
}

#[test]
fn bundle() {
    replay("bundle", haptic_agent::fuzzing::bundle);
}
