//! Just enough of the Kubernetes protobuf encoding to accept the bodies kubectl ≥ 1.33 sends for
//! its typed generators (`kubectl create configmap|secret|namespace`): the `k8s\0` envelope
//! (`runtime.Unknown`), ObjectMeta's user-settable fields, and ConfigMap, Secret and Namespace.
//! Any other kind is refused with 415, as before.

use serde_json::{json, Map, Value};

use crate::util::base64_encode;

/// One decoded field: number and payload.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.data.split_first().ok_or("truncated varint")?;
            self.data = rest;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.data.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if self.data.len() < n {
                    return Err("truncated fixed field".into());
                }
                self.data = &self.data[n..];
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                if self.data.len() < len {
                    return Err("truncated length-delimited field".into());
                }
                let (bytes, rest) = self.data.split_at(len);
                self.data = rest;
                Field::Bytes(bytes)
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        Ok(Some((key >> 3, field)))
    }
}

fn fields(data: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut r = Reader { data };
    let mut out = Vec::new();
    while let Some(f) = r.next()? {
        out.push(f);
    }
    Ok(out)
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "string field is not UTF-8".to_string())
}

/// A `map<string, string|bytes>` entry (`bytes_as_base64` for bytes values).
fn map_entry(b: &[u8], bytes_as_base64: bool, into: &mut Map<String, Value>) -> Result<(), String> {
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(k)) => key = text(k)?,
            (2, Field::Bytes(v)) if bytes_as_base64 => value = json!(base64_encode(v)),
            (2, Field::Bytes(v)) => value = json!(text(v)?),
            _ => {}
        }
    }
    into.insert(key, value);
    Ok(())
}

fn object_meta(b: &[u8]) -> Result<Value, String> {
    let mut meta = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(v)) => {
                meta.insert("name".into(), json!(text(v)?));
            }
            (2, Field::Bytes(v)) => {
                meta.insert("generateName".into(), json!(text(v)?));
            }
            (3, Field::Bytes(v)) => {
                meta.insert("namespace".into(), json!(text(v)?));
            }
            (11, Field::Bytes(v)) => map_entry(v, false, &mut labels)?,
            (12, Field::Bytes(v)) => map_entry(v, false, &mut annotations)?,
            (14, Field::Bytes(v)) => finalizers.push(json!(text(v)?)),
            _ => {}
        }
    }
    for (k, m) in [("labels", labels), ("annotations", annotations)] {
        if !m.is_empty() {
            meta.insert(k.into(), Value::Object(m));
        }
    }
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(meta))
}

/// Decodes a `k8s\0`-framed protobuf body into the equivalent JSON object.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let inner = body
        .strip_prefix(b"k8s\0")
        .ok_or("missing k8s protobuf envelope")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(inner)? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                for (m, g) in fields(tm)? {
                    match (m, g) {
                        (1, Field::Bytes(v)) => api_version = text(v)?,
                        (2, Field::Bytes(v)) => kind = text(v)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(r)) => raw = r,
            _ => {}
        }
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind.clone()));
    let mut data = Map::new();
    let mut other = Map::new();
    for (n, f) in fields(raw)? {
        match (kind.as_str(), n, f) {
            (_, 1, Field::Bytes(m)) => {
                obj.insert("metadata".into(), object_meta(m)?);
            }
            ("ConfigMap", 2, Field::Bytes(e)) => map_entry(e, false, &mut data)?,
            ("ConfigMap", 3, Field::Bytes(e)) => map_entry(e, true, &mut other)?,
            ("Secret", 2, Field::Bytes(e)) => map_entry(e, true, &mut data)?,
            ("Secret", 3, Field::Bytes(t)) => {
                obj.insert("type".into(), json!(text(t)?));
            }
            ("Secret", 4, Field::Bytes(e)) => map_entry(e, false, &mut other)?,
            ("ConfigMap", 4, Field::Varint(b)) | ("Secret", 5, Field::Varint(b)) => {
                obj.insert("immutable".into(), json!(b != 0));
            }
            ("Namespace", 2, Field::Bytes(spec)) => {
                let mut fin = Vec::new();
                for (m, g) in fields(spec)? {
                    if let (1, Field::Bytes(v)) = (m, g) {
                        fin.push(json!(text(v)?));
                    }
                }
                obj.insert("spec".into(), json!({"finalizers": fin}));
            }
            ("ConfigMap" | "Secret" | "Namespace", _, _) => {}
            (k, _, _) => return Err(format!("protobuf bodies for kind {k:?} are not supported")),
        }
    }
    if !data.is_empty() {
        obj.insert("data".into(), Value::Object(data));
    }
    if !other.is_empty() {
        let key = if kind == "Secret" {
            "stringData"
        } else {
            "binaryData"
        };
        obj.insert(key.into(), Value::Object(other));
    }
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_configmap() {
        let meta = [
            field(1, b"cm"),
            field(11, &[field(1, b"app"), field(2, b"web")].concat()),
        ]
        .concat();
        let raw = [
            field(1, &meta),
            field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm", "labels": {"app": "web"}}, "data": {"k": "v"}})
        );
    }
}
