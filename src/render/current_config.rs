//! `current_config`: the configuration the HAProxy pods run now, reduced to what templates need
//! to keep server slots stable: backends and their servers.

use std::collections::BTreeMap;

use haptic_agent::haproxy_cfg::{Config, ServerLine, SocketAddress};
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, Value};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Server {
    pub name: String,
    /// The address as written (`10.0.0.1`, `::1`, a host name).
    pub address: String,
    pub port: Option<u16>,
    pub enabled: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Backend {
    pub name: String,
    pub servers: Vec<Server>,
}

/// Parsed once per deployed config and shared by every render until it changes.
#[derive(Debug, Clone, Default)]
pub struct CurrentConfig {
    backends: Arc<BTreeMap<String, Backend>>,
}

impl CurrentConfig {
    pub fn parse(text: &str) -> CurrentConfig {
        let mut backends = BTreeMap::new();
        for section in Config::parse(text)
            .sections
            .iter()
            .filter(|s| s.has_servers())
        {
            let servers = section
                .lines
                .iter()
                .filter_map(|tokens| ServerLine::parse(tokens))
                .map(|line| {
                    let (address, port) = match SocketAddress::parse(&line.address) {
                        Some(sa) => (sa.ip.to_string(), Some(sa.port)),
                        None => (line.address.clone(), None),
                    };
                    Server {
                        name: line.name,
                        address,
                        port,
                        enabled: !line.disabled,
                    }
                })
                .collect();
            backends.insert(
                section.name().to_string(),
                Backend {
                    name: section.name().to_string(),
                    servers,
                },
            );
        }
        CurrentConfig {
            backends: Arc::new(backends),
        }
    }

    pub fn backend(&self, name: &str) -> Option<&Backend> {
        self.backends.get(name)
    }

    /// `current_config` as templates see it: `current_config.backends[name]`. Lookups by name
    /// are recorded by render units, so a unit depends only on its own backends.
    pub fn value(&self) -> Value {
        Value::from_object(View {
            backends: Value::from_object(BackendsView {
                backends: self.backends.clone(),
            }),
        })
    }

    pub fn empty_value() -> Value {
        CurrentConfig::default().value()
    }
}

#[derive(Debug)]
struct View {
    backends: Value,
}

impl Object for View {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "backends" => Some(self.backends.clone()),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["backends"])
    }
}

#[derive(Debug)]
struct BackendsView {
    backends: Arc<BTreeMap<String, Backend>>,
}

impl Object for BackendsView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = key.as_str()?;
        let found = self.backends.get(name);
        super::units::note_current_read(name, found);
        found.map(|b| Value::from(minijinja::value::Serde(b)))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.backends
                .keys()
                .map(|k| Value::from(k.as_str()))
                .collect(),
        )
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.backends.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backends_and_servers() {
        let cfg = CurrentConfig::parse(
            "global\n  daemon\nbackend be_web\n  server SRV_1 10.0.0.1:8080 enabled # pod a\n  server SRV_2 127.0.0.1:1 disabled\nbackend be_v6\n  server SRV_1 [::1]:80\n",
        );
        let be = cfg
            .value()
            .get_attr("backends")
            .unwrap()
            .get_attr("be_web")
            .unwrap();
        let servers = be.get_attr("servers").unwrap();
        assert_eq!(servers.len(), Some(2));
        let first = servers.get_item(&Value::from(0)).unwrap();
        assert_eq!(
            first.get_attr("address").unwrap().as_str(),
            Some("10.0.0.1")
        );
        assert_eq!(first.get_attr("port").unwrap().as_i64(), Some(8080));
        assert!(first.get_attr("enabled").unwrap().is_true());
        assert!(!servers
            .get_item(&Value::from(1))
            .unwrap()
            .get_attr("enabled")
            .unwrap()
            .is_true());
        let v6 = cfg
            .value()
            .get_attr("backends")
            .unwrap()
            .get_attr("be_v6")
            .unwrap()
            .get_attr("servers")
            .unwrap();
        assert_eq!(
            v6.get_item(&Value::from(0))
                .unwrap()
                .get_attr("address")
                .unwrap()
                .as_str(),
            Some("::1")
        );
    }
}
