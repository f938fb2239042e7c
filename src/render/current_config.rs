//! `current_config`: the configuration the HAProxy pods run now, reduced to what templates need
//! to keep server slots stable: backends and their servers.

use std::collections::BTreeMap;

use haptic_agent::haproxy_cfg::{changed_sections, Config, ServerLine, SocketAddress};
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
    backends: Arc<BTreeMap<String, Arc<Backend>>>,
    /// Whether some name is defined by more than one section (the later one is in the map).
    /// An update then parses everything: removing the later section would uncover the earlier.
    duplicated: bool,
}

/// The map of `backends_of`'s list, and whether a name occurred twice in it.
fn collect(list: Vec<(String, Arc<Backend>)>) -> (BTreeMap<String, Arc<Backend>>, bool) {
    let len = list.len();
    let map: BTreeMap<_, _> = list.into_iter().collect();
    let duplicated = map.len() != len;
    (map, duplicated)
}

/// The backends (and listens) of a parsed configuration, in order; a later one of the same name
/// wins, as in a map built in order.
fn backends_of(config: &Config) -> Vec<(String, Arc<Backend>)> {
    config
        .sections
        .iter()
        .filter(|s| s.has_servers())
        .map(|section| {
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
            let name = section.name().to_string();
            (name.clone(), Arc::new(Backend { name, servers }))
        })
        .collect()
}

impl CurrentConfig {
    pub fn parse(text: &str) -> CurrentConfig {
        let (backends, duplicated) = collect(backends_of(&Config::parse(text)));
        CurrentConfig {
            backends: Arc::new(backends),
            duplicated,
        }
    }

    /// The parse of `new_text`, given that `self` is the parse of `old_text`: only the sections
    /// between the first and the last differing line are parsed again (a runtime change in a
    /// large configuration costs its sections). Equal to `CurrentConfig::parse(new_text)`.
    pub fn update(&self, old_text: &str, new_text: &str) -> CurrentConfig {
        if old_text == new_text {
            return self.clone();
        }
        if self.duplicated {
            return CurrentConfig::parse(new_text);
        }
        let (old_window, new_window) = changed_sections(old_text, new_text);
        let (old_window, new_window) = (backends_of(&old_window), backends_of(&new_window));
        let mut backends = (*self.backends).clone();
        // Every name of the old text is defined once: the window's own sections go.
        for (name, _) in &old_window {
            backends.remove(name);
        }
        // A new section named like one outside the window makes a duplicate: parse everything.
        if new_window
            .iter()
            .any(|(name, _)| backends.contains_key(name))
        {
            return CurrentConfig::parse(new_text);
        }
        let (added, duplicated) = collect(new_window);
        backends.extend(added);
        CurrentConfig {
            backends: Arc::new(backends),
            duplicated,
        }
    }

    pub fn backend(&self, name: &str) -> Option<&Backend> {
        self.backends.get(name).map(|b| &**b)
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
    backends: Arc<BTreeMap<String, Arc<Backend>>>,
}

impl Object for BackendsView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = key.as_str()?;
        let found = self.backends.get(name).map(|b| &**b);
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

    /// The incremental update equals a parse of the new text, over random edits of a
    /// many-backend configuration: server changes, lines added and removed, sections added,
    /// removed and renamed (duplicates included), edits at the start and the end, several at once.
    #[test]
    fn update_equals_a_fresh_parse() {
        let base: Vec<String> = {
            let mut l = vec![
                "global".to_string(),
                "  maxconn 10".into(),
                "frontend f".into(),
                "  bind :80".into(),
            ];
            for b in 0..15 {
                l.push(format!("backend be{b}"));
                for s in 1..=3 {
                    l.push(format!("  server SRV_{s} 10.0.{b}.{s}:80 enabled"));
                }
            }
            l
        };
        let mut seed: u64 = 0x2545f4914f6cdd1d;
        let mut rand = |n: usize| {
            crate::xorshift(&mut seed);
            (seed % n.max(1) as u64) as usize
        };
        for round in 0..500 {
            let mut old = base.clone();
            // Sometimes the old text is itself an edited one.
            if round % 4 == 0 {
                let i = rand(old.len());
                old[i] = format!("  server SRV_9 10.1.1.{}:81 disabled", rand(200));
            }
            let mut new = old.clone();
            for _ in 0..1 + round % 3 {
                let i = rand(new.len()).min(new.len().saturating_sub(1));
                let r = rand(20);
                match rand(8) {
                    0 => new[i] = format!("  server SRV_{r} 10.9.9.{r}:8080 enabled"),
                    1 => new[i] = format!("  server SRV_1 10.0.0.1:80 disabled # {r}"),
                    2 => {
                        new.remove(i);
                    }
                    3 => new.insert(i, format!("  server SRV_{r} 10.8.8.{r}:80")),
                    4 => new.insert(i, format!("backend be{r}")),
                    5 => new[i] = format!("listen be{}", r % 15),
                    6 => new.insert(0, format!("backend first{r}")),
                    _ => new.push(format!("  server SRV_{r} 10.7.7.7:80")),
                }
            }
            let (old, new) = (old.join("\n") + "\n", new.join("\n") + "\n");
            let updated = CurrentConfig::parse(&old).update(&old, &new);
            let fresh = CurrentConfig::parse(&new);
            assert_eq!(updated.backends, fresh.backends, "round {round}:\n{new}");
        }
    }

    /// Found by the `haproxy_cfg` fuzz target: two sections of one name with equal content;
    /// removing the later one uncovers the earlier, which the update must not lose.
    #[test]
    fn removing_a_duplicate_section_uncovers_the_earlier_one() {
        let old = "backend be\n  balance roundrobin\nbackend be\n";
        let new = "backend be\n  balance roundrobin\nlisten other\n";
        let updated = CurrentConfig::parse(old).update(old, new);
        assert!(updated.backend("be").is_some());
        assert_eq!(updated.backends, CurrentConfig::parse(new).backends);
    }

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
