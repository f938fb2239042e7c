//! Entry points for the coverage-guided fuzz targets in `fuzz/` (`scripts/fuzz.sh`), also
//! replayed over the committed corpora by the controller crate's `tests/fuzz_corpora.rs`.

use std::io::{BufReader, Cursor};
use std::time::{Duration, Instant};

use crate::files::check_path_shape;
use crate::http::{self, Limits};
use crate::protocol::{api, Bundle, BundleHash, WireBundle};

/// One API request as the agent reads it from a connection: head, body, and for a bundle PUT
/// the bundle's JSON, wire checks and path checks. A request that reads successfully has a
/// method and path without spaces, and a body of exactly its announced length.
pub fn http_request(data: &[u8]) {
    let limits = Limits {
        max_head_bytes: 4096,
        max_headers: 32,
        max_body_bytes: 1 << 20,
    };
    let mut reader = BufReader::new(Cursor::new(data));
    let Ok(head) = http::read_head(&mut reader, &limits) else {
        return;
    };
    assert!(!head.method.contains(' ') && !head.path.contains(' '));
    let _ = head.query_param("dry_run");
    let _ = head.header(api::IF_MATCH).map(BundleHash::parse);
    let Ok(len) = http::body_length(&head, &limits) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let Ok(body) = http::read_body(&mut reader, len, deadline) else {
        return;
    };
    assert_eq!(body.len(), len);
    if head.path == api::BUNDLE {
        bundle(&body);
    }
}

/// A bundle body: JSON, kinds and encodings, duplicate paths, path shapes. An accepted bundle
/// survives its wire form unchanged, hash included.
pub fn bundle(data: &[u8]) {
    let Ok(wire) = serde_json::from_slice::<WireBundle>(data) else {
        return;
    };
    let Ok(bundle) = Bundle::from_wire(wire) else {
        return;
    };
    for f in &bundle.files {
        let _ = check_path_shape(&f.path);
    }
    let again = Bundle::from_wire(bundle.to_wire()).expect("an accepted bundle's wire form");
    assert_eq!(again, bundle);
    assert_eq!(again.hash(), bundle.hash());
}
