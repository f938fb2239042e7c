//! The `spec` of the published `HAProxyCfg`, and reading it back.
//!
//! A configuration at or above `spec.controller.configPublishing.compressionThreshold` bytes is
//! published compressed, as upstream does: `content` is zstd, then base64, and `compressed` is
//! true. Uncompressed, 10,000 Ingresses make about 4.4 MB of haproxy.cfg, and the API server
//! refuses any object above about 1.5 MiB (etcd's request limit); compressed, the same
//! configuration is about 300 KB. `checksum` is always the sha256 of the uncompressed text.
//! Read it with `haptic config view`, or `base64 -d | zstd -d`.

use haptic_agent::protocol::sha256_hex;
use serde_json::{json, Value};

/// The largest configuration read back from a compressed `content`: a guard against a
/// decompression bomb in an object someone else wrote (only the controller and whoever may write
/// HAProxyCfgs in its namespace; tenants cannot). A few kilobytes of zstd can expand to any
/// size, and parsing costs a few times the text in memory; 32 MiB is about seven times the
/// configuration of 10,000 Ingresses. A larger one is not read back (slots start afresh).
pub const MAX_CONTENT: usize = 32 << 20;

/// etcd's default request limit (1.5 MiB): the API server refuses a larger object.
pub const MAX_OBJECT: usize = 1_572_864;

/// The object's name for the HAProxyTemplateConfig `config_name`.
pub fn name(config_name: &str) -> String {
    format!("{config_name}-haproxycfg")
}

/// What a published object holds, read back ([`read`]).
pub struct Stored {
    pub content: String,
    /// `spec.bundle` (empty when absent).
    pub bundle: String,
    pub checksum: Option<String>,
}

/// The configuration ([`content`]) with the object's `spec.bundle` and `spec.checksum`.
pub fn read(object: &Value) -> Result<Stored, String> {
    let content = content(object)?;
    let field = |path| object.pointer(path).and_then(Value::as_str);
    Ok(Stored {
        content,
        bundle: field("/spec/bundle").unwrap_or_default().to_string(),
        checksum: field("/spec/checksum").map(str::to_string),
    })
}

/// The `spec` for `haproxy_cfg`: compressed when `threshold` is above 0 and the text is at
/// least that long (0 never compresses).
pub fn spec(haproxy_cfg: &str, threshold: i64, bundle: &str) -> Value {
    let checksum = format!("sha256:{}", sha256_hex(haproxy_cfg.as_bytes()));
    let compress = threshold > 0 && haproxy_cfg.len() as u64 >= threshold as u64;
    let content = if compress {
        let packed = ruzstd::encoding::compress_to_vec(
            haproxy_cfg.as_bytes(),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        haptic_agent::base64::encode(&packed)
    } else {
        haproxy_cfg.to_string()
    };
    json!({"content": content, "compressed": compress, "checksum": checksum, "bundle": bundle})
}

/// The haproxy.cfg a published `HAProxyCfg` object holds, decompressed and checked against its
/// `checksum` when it has one. The error says what is wrong with the object.
pub fn content(object: &Value) -> Result<String, String> {
    content_within(object, MAX_CONTENT)
}

fn content_within(object: &Value, limit: usize) -> Result<String, String> {
    let spec = object.get("spec").ok_or("no spec")?;
    if let Some(why) = spec.get("notPublished").and_then(Value::as_str) {
        return Err(format!("no configuration published: {why}"));
    }
    let content = spec
        .get("content")
        .and_then(Value::as_str)
        .ok_or("spec.content is not a string")?;
    let compressed = match spec.get("compressed") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("spec.compressed is not a boolean".into()),
    };
    let text = if compressed {
        let packed = haptic_agent::base64::decode(content.trim())
            .map_err(|e| format!("spec.content is not base64: {e}"))?;
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(&packed[..])
            .map_err(|e| format!("spec.content is not zstd: {e}"))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut decoder, limit as u64 + 1),
            &mut bytes,
        )
        .map_err(|e| format!("spec.content is not zstd: {e}"))?;
        if bytes.len() > limit {
            return Err(format!(
                "spec.content decompresses to more than {} MiB",
                limit >> 20
            ));
        }
        String::from_utf8(bytes).map_err(|_| "spec.content decompresses to non-UTF-8 bytes")?
    } else {
        content.to_string()
    };
    match spec.get("checksum").and_then(Value::as_str) {
        Some(want) if want != format!("sha256:{}", sha256_hex(text.as_bytes())) => {
            Err(format!("spec.content does not match spec.checksum {want}"))
        }
        _ => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lines: usize) -> String {
        (0..lines)
            .map(|i| {
                format!(
                    "backend be_{i}\n    server SRV_1 10.0.{}.{}:80\n",
                    i / 250,
                    i % 250
                )
            })
            .collect()
    }

    #[test]
    fn small_configs_stay_readable_and_large_ones_are_compressed() {
        let small = config(10);
        let spec_small = spec(&small, 1 << 20, "b1");
        assert_eq!(spec_small["compressed"], false);
        assert_eq!(spec_small["content"], small.as_str());
        assert_eq!(
            content(&json!({ "spec": spec_small })).unwrap(),
            small,
            "an uncompressed spec reads back"
        );

        let large = config(40_000);
        assert!(large.len() > 1 << 20);
        let spec_large = spec(&large, 1 << 20, "b2");
        assert_eq!(spec_large["compressed"], true);
        let published = spec_large["content"].as_str().unwrap();
        assert!(
            published.len() * 5 < large.len(),
            "compressed to {} of {} bytes",
            published.len(),
            large.len()
        );
        assert_eq!(
            spec_large["checksum"],
            format!("sha256:{}", sha256_hex(large.as_bytes()))
        );
        assert_eq!(content(&json!({ "spec": spec_large })).unwrap(), large);

        // The threshold is inclusive; 0 never compresses.
        assert_eq!(spec(&small, small.len() as i64, "b")["compressed"], true);
        assert_eq!(
            spec(&small, small.len() as i64 + 1, "b")["compressed"],
            false
        );
        assert_eq!(spec(&large, 0, "b")["compressed"], false);
    }

    #[test]
    fn the_zstd_cli_reads_what_is_published() {
        // The reference decoder (scripts/test.sh installs it), as a user reading the object.
        let large = config(5_000);
        let spec = spec(&large, 1, "b");
        let packed = haptic_agent::base64::decode(spec["content"].as_str().unwrap()).unwrap();
        let mut child = std::process::Command::new("zstd")
            .args(["-d", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("zstd (Debian package zstd; scripts/test.sh installs it)");
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &packed));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8(out.stdout).unwrap(), large);
    }

    #[test]
    fn damaged_or_hostile_content_is_refused_with_the_reason() {
        let large = config(2_000);
        let good = spec(&large, 1, "b");
        let with = |field: &str, value: Value| {
            let mut spec = good.clone();
            spec[field] = value;
            json!({ "spec": spec })
        };
        let err = |object: Value| content(&object).unwrap_err();
        assert!(err(with("content", json!("not base64!"))).contains("not base64"));
        assert!(err(with("content", json!("aGVsbG8gd29ybGQ="))).contains("not zstd"));
        assert!(err(with("compressed", json!("yes"))).contains("not a boolean"));
        assert!(err(with("content", json!(7))).contains("not a string"));
        assert!(err(with("checksum", json!("sha256:00"))).contains("does not match"));
        let mut truncated = good["content"].as_str().unwrap().to_string();
        truncated.truncate(truncated.len() / 2 / 4 * 4);
        assert!(err(with("content", json!(truncated))).contains("not zstd"));
        assert!(err(json!({})).contains("no spec"));
        // What the controller leaves when the API server refuses a configuration as too large.
        assert!(err(
            json!({"spec": {"content": "", "bundle": "", "compressed": false,
            "notPublished": "bundle 1234 is too large for the API server"}})
        )
        .contains("no configuration published: bundle 1234 is too large"));
        // A bomb: many bytes of one value compress to little, and reading stops at the limit.
        let bomb = ruzstd::encoding::compress_to_vec(
            std::io::Read::take(std::io::repeat(b'a'), 3 << 20),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert!(bomb.len() < 64 << 10);
        let bomb =
            json!({"spec": {"content": haptic_agent::base64::encode(&bomb), "compressed": true}});
        assert!(content_within(&bomb, 2 << 20)
            .unwrap_err()
            .contains("more than 2 MiB"));
        assert_eq!(content_within(&bomb, 4 << 20).unwrap().len(), 3 << 20);
        // An object of an older controller (no `compressed`, no checksum) reads as it is.
        assert_eq!(
            content(&json!({"spec": {"content": "global\n"}})).unwrap(),
            "global\n"
        );
    }
}
