//! The six template libraries in the chart's merge order, and their merged config: shared by
//! the traffic tests, the differential and hostile-walk tests, and the render benchmark.

#![allow(dead_code)]

/// The six libraries, in merge order, relative to the repository root.
pub const LIBRARIES: [&str; 6] = [
    "chart/libraries/base.yaml",
    "chart/libraries/ssl.yaml",
    "chart/libraries/ingress.yaml",
    "chart/libraries/gateway.yaml",
    "chart/libraries/haproxytech.yaml",
    "chart/libraries/haproxy-ingress.yaml",
];

/// The merged, validated config of `files` (paths relative to the repository root).
pub fn spec_of<S: AsRef<str>>(files: &[S]) -> haptic::config::Spec {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let paths: Vec<_> = files.iter().map(|f| root.join(f.as_ref())).collect();
    haptic::config::load_files(&paths)
        .and_then(|d| d.valid_spec("libraries"))
        .expect("the libraries load")
}

/// The merged config of the six libraries.
pub fn spec() -> haptic::config::Spec {
    spec_of(&LIBRARIES)
}
