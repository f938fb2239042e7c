//! `current_config`: the configuration the HAProxy pods run now, reduced to what templates need
//! to keep server slots stable: backends and their servers.

use std::collections::BTreeMap;

use haptic_agent::haproxy_cfg::{Config, ServerLine, SocketAddress};
use minijinja::value::Value;
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
#[derive(Debug, Clone)]
pub struct CurrentConfig {
    value: Value,
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
            value: Value::from(minijinja::value::Serde(BTreeMap::from([(
                "backends", backends,
            )]))),
        }
    }

    pub fn value(&self) -> Value {
        self.value.clone()
    }

    pub fn empty_value() -> Value {
        Value::from(minijinja::value::Serde(BTreeMap::from([(
            "backends",
            BTreeMap::<String, Backend>::new(),
        )])))
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
