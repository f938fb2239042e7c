//! The `HAProxyTemplateConfig`: its wire model and defaults ([`model`]), structural validation
//! ([`validate`]), and loading and merging of config files.
//!
//! # Merge
//!
//! Several config fragments (files, or documents within one file) combine in order, exactly as
//! the Helm chart combines the template libraries and user values:
//!
//! * mappings merge key by key; for a key present in both, the later value wins, and when both
//!   values are mappings they merge recursively by the same rule;
//! * a `null` value in a later fragment removes the key (this is how a user disables a template
//!   or snippet contributed by a library);
//! * lists and scalars are replaced as a whole (`indexBy`, `assertions` and `postProcessing` are
//!   never concatenated);
//! * a fragment may be a full manifest (`apiVersion`, `kind`, `metadata`, `spec`) or a bare spec;
//!   specs merge with specs and metadata with metadata.
//!
//! # Limits
//!
//! Input is bounded before it is deserialized (`input`): file size, nesting depth and alias
//! expansion; every duration and number has a range ([`model::DURATION_FIELDS`],
//! [`model::INT_FIELDS`]). docs/operations.md lists them all.

pub mod duration;
pub(crate) mod input;
pub mod model;
pub mod validate;

use std::fmt;
use std::path::Path;

use serde_json::Value;

pub use model::Spec;
pub use validate::{validate_spec, FieldError};

/// Why a config could not be loaded.
#[derive(Debug)]
pub enum ConfigError {
    Read { path: String, error: std::io::Error },
    Parse { source: String, message: String },
    NotAConfig { source: String, message: String },
    Invalid(Vec<FieldError>),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, error } => write!(f, "read {path}: {error}"),
            ConfigError::Parse { source, message } => write!(f, "{source}: {message}"),
            ConfigError::NotAConfig { source, message } => write!(f, "{source}: {message}"),
            ConfigError::Invalid(errors) => {
                write!(
                    f,
                    "invalid HAProxyTemplateConfig ({} problem{}):",
                    errors.len(),
                    if errors.len() == 1 { "" } else { "s" }
                )?;
                for e in errors {
                    write!(f, "\n  {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// A merged config document: optional manifest metadata plus the raw spec as written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigDocument {
    pub metadata: Option<Value>,
    pub spec: Value,
}

impl ConfigDocument {
    /// Parses the raw spec into the typed model, with the field path in any type error.
    pub fn typed_spec(&self, source: &str) -> Result<Spec, ConfigError> {
        input::check_depth(&self.spec, "spec").map_err(|message| ConfigError::Parse {
            source: source.to_string(),
            message,
        })?;
        serde_path_to_error::deserialize::<_, Spec>(&self.spec).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            ConfigError::Parse {
                source: source.to_string(),
                message: format!("{path}: {}", e.inner()),
            }
        })
    }

    /// Typed and structurally valid spec.
    pub fn valid_spec(&self, source: &str) -> Result<Spec, ConfigError> {
        let spec = self.typed_spec(source)?;
        validate_spec(&spec).map_err(ConfigError::Invalid)?;
        Ok(spec)
    }

    /// The spec a controller or `haptic render` runs: typed and valid, with its validation
    /// tests checked and then dropped. Only `haptic validate` runs them; kept, their fixtures
    /// would stay in memory for the life of the process (about 4 MB for the six libraries).
    pub fn runtime_spec(&self, source: &str) -> Result<Spec, ConfigError> {
        let mut spec = self.valid_spec(source)?;
        spec.validation_tests = Default::default();
        Ok(spec)
    }

    /// The document as YAML: a full manifest when any fragment had metadata, else a bare spec.
    pub fn to_yaml(&self) -> String {
        let value = match &self.metadata {
            Some(metadata) => serde_json::json!({
                "apiVersion": model::API_VERSION,
                "kind": model::KIND,
                "metadata": metadata,
                "spec": self.spec,
            }),
            None => self.spec.clone(),
        };
        // Serialising a serde_json::Value to YAML cannot fail: keys are strings.
        serde_yaml::to_string(&value).unwrap_or_default()
    }

    pub fn merge(&mut self, other: ConfigDocument) {
        if let Some(metadata) = other.metadata {
            match &mut self.metadata {
                Some(mine) => merge_values(mine, metadata),
                None => self.metadata = Some(metadata),
            }
        }
        merge_values(&mut self.spec, other.spec);
    }
}

/// Merges `overlay` into `base` by the rules in the module documentation.
pub fn merge_values(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                if value.is_null() {
                    base.remove(&key);
                    continue;
                }
                match base.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge_values(existing, value)
                    }
                    _ => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, overlay) => *base = overlay,
    }
}

/// Splits a YAML text into config fragments (one per non-empty document). Text over the
/// `input` limits is refused before it is deserialized.
pub fn parse_fragments(text: &str, source: &str) -> Result<Vec<ConfigDocument>, ConfigError> {
    use serde::Deserialize;
    input::check_yaml(text).map_err(|message| ConfigError::Parse {
        source: source.to_string(),
        message,
    })?;
    let mut fragments = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| ConfigError::Parse {
            source: source.to_string(),
            message: format!("document {}: {e}", i + 1),
        })?;
        if value.is_null() {
            continue;
        }
        fragments.push(fragment_from_value(value, source)?);
    }
    Ok(fragments)
}

fn fragment_from_value(value: Value, source: &str) -> Result<ConfigDocument, ConfigError> {
    let Value::Object(mut map) = value else {
        return Err(ConfigError::NotAConfig {
            source: source.into(),
            message: "expected a mapping (a manifest or a spec)".into(),
        });
    };
    let is_manifest = map.contains_key("kind") || map.contains_key("apiVersion");
    if !is_manifest {
        return bare_fragment(map, source);
    }
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = map
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != model::KIND || api_version.split('/').next() != Some(model::GROUP) {
        return Err(ConfigError::NotAConfig {
            source: source.into(),
            message: format!(
                "expected kind {} in group {}, got kind {kind:?} apiVersion {api_version:?}",
                model::KIND,
                model::GROUP
            ),
        });
    }
    if api_version != model::API_VERSION {
        return Err(ConfigError::NotAConfig {
            source: source.into(),
            message: format!(
                "unsupported apiVersion {api_version:?} (this version reads {})",
                model::API_VERSION
            ),
        });
    }
    let metadata = map
        .remove("metadata")
        .unwrap_or_else(|| serde_json::json!({}));
    let spec = map.remove("spec").unwrap_or_else(|| serde_json::json!({}));
    if !spec.is_object() {
        return Err(ConfigError::NotAConfig {
            source: source.into(),
            message: "spec: expected a mapping".into(),
        });
    }
    Ok(ConfigDocument {
        metadata: Some(metadata),
        spec,
    })
}

/// A document without `apiVersion`/`kind`: either a bare spec (its fields at the top level) or a
/// spec fragment written the way overrides usually are, `spec: {…}` and nothing else. No spec
/// field is named `spec` or `metadata`, so any other mix of those keys is ambiguous and refused.
fn bare_fragment(
    mut map: serde_json::Map<String, Value>,
    source: &str,
) -> Result<ConfigDocument, ConfigError> {
    let refuse = |message: String| ConfigError::NotAConfig {
        source: source.into(),
        message,
    };
    if map.contains_key("metadata") {
        return Err(refuse(
            "a document with `metadata` but no `apiVersion`/`kind`: add them for a manifest, \
             or write only `spec: {…}` or the spec's fields at the top level"
                .into(),
        ));
    }
    if !map.contains_key("spec") {
        return Ok(ConfigDocument {
            metadata: None,
            spec: Value::Object(map),
        });
    }
    if map.len() > 1 {
        let mut others: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "spec")
            .collect();
        others.sort_unstable();
        return Err(refuse(format!(
            "a top-level `spec` next to spec fields ({}): write a spec fragment as `spec: {{…}}` \
             alone, or the spec's fields at the top level",
            others.join(", ")
        )));
    }
    match map.remove("spec") {
        Some(spec @ Value::Object(_)) => Ok(ConfigDocument {
            metadata: None,
            spec,
        }),
        _ => Err(refuse("spec: expected a mapping".into())),
    }
}

/// Reads and merges config files in order.
pub fn load_files<P: AsRef<Path>>(paths: &[P]) -> Result<ConfigDocument, ConfigError> {
    let mut merged = ConfigDocument {
        metadata: None,
        spec: Value::Object(Default::default()),
    };
    for path in paths {
        let path = path.as_ref();
        let source = path.display().to_string();
        let text = read_limited(path).map_err(|error| ConfigError::Read {
            path: source.clone(),
            error,
        })?;
        for fragment in parse_fragments(&text, &source)? {
            merged.merge(fragment);
        }
    }
    Ok(merged)
}

/// Reads a file of at most [`input::MAX_INPUT_BYTES`] without reading more than that (the
/// path may be a pipe or a device that never ends).
fn read_limited(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let too_large = |len: usize| std::io::Error::other(input::too_large(len));
    if let Ok(meta) = file.metadata() {
        if meta.is_file() && meta.len() > input::MAX_INPUT_BYTES as u64 {
            return Err(too_large(usize::try_from(meta.len()).unwrap_or(usize::MAX)));
        }
    }
    let mut bytes = Vec::new();
    file.take(input::MAX_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > input::MAX_INPUT_BYTES {
        return Err(std::io::Error::other(format!(
            "more than the {} MiB a config file may have",
            input::MAX_INPUT_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Names the sources for messages: `a.yaml` or `a.yaml + b.yaml`.
pub fn describe_sources<P: AsRef<Path>>(paths: &[P]) -> String {
    paths
        .iter()
        .map(|p| p.as_ref().display().to_string())
        .collect::<Vec<_>>()
        .join(" + ")
}

#[cfg(test)]
mod tests;
