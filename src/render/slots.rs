//! `server_lines(…)`: the server slots of one backend, computed natively.
//!
//! Every backend of every library goes through this, so it is the hottest code of a render:
//! written as a template it cost ~100 µs per backend (10,000 backends: a second). It keeps the
//! template's contract exactly (DESIGN §6 "Server slots"):
//!
//! - the Service port is found by number or by name; every EndpointSlice of the Service (store
//!   `endpoints`, indexed by namespace and `kubernetes.io/service-name`) contributes, for the
//!   slice port with the same name, every address of every endpoint not marked `ready: false`;
//! - endpoints keep the slot they have in `current_config`; new ones fill the lowest free slots
//!   in sorted order; the pool is `slots_min`, doubled until every endpoint fits, and never
//!   smaller than the running pool; unused slots are disabled placeholders.
//!
//! Endpoint addresses are tenant data (a tenant can write EndpointSlices): only IP literals are
//! used (FQDN slices and anything else are skipped), and the admin's `refuse_ranges` (CIDRs)
//! keep endpoints out of, for example, loopback and link-local space.
//!
//! Store and `current_config` reads are recorded like template reads, so render units that call
//! this replay correctly.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::current_config::Server;
use super::units::{self, StoreMethod};
use crate::store::{Doc, NodeRef};

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// A CIDR from the admin's `refuse_endpoint_ranges`.
struct Range {
    net: IpAddr,
    prefix: u8,
}

impl Range {
    fn parse(text: &str) -> Result<Range, Error> {
        let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
        let net: IpAddr = addr
            .parse()
            .map_err(|_| invalid(format!("refuse_endpoint_ranges: {text:?} is not a CIDR")))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| invalid(format!("refuse_endpoint_ranges: bad prefix in {text:?}")))?
        };
        Ok(Range { net, prefix })
    }

    fn contains(&self, ip: &IpAddr) -> bool {
        // An IPv4 range also matches the IPv4-mapped IPv6 form of its addresses.
        if let (IpAddr::V6(v6), IpAddr::V4(_)) = (ip, &self.net) {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return self.contains(&IpAddr::V4(v4));
            }
        }
        // Both as 128 bits from the top (IPv4 in the high 32), so a prefix masks the same way.
        let bits = |ip: &IpAddr| -> Option<u128> {
            match (ip, &self.net) {
                (IpAddr::V4(a), IpAddr::V4(_)) => Some(u128::from(u32::from(*a)) << 96),
                (IpAddr::V6(a), IpAddr::V6(_)) => Some(u128::from(*a)),
                _ => None,
            }
        };
        let (Some(a), Some(n)) = (bits(ip), bits(&self.net)) else {
            return false;
        };
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.prefix))
            .unwrap_or(0);
        a & mask == n & mask
    }
}

fn text(v: Option<NodeRef<'_>>) -> &str {
    v.and_then(NodeRef::as_str).unwrap_or("")
}

/// `server_lines(be_name, svc_ns, svc_name, svc_port, slots=N, default_slots=N, refuse=[CIDR, …],
/// max_endpoints=N, cookies=bool, cookie_prefix=str)`: `slots` is a per-backend pool size from
/// tenant data (1–1024, refused otherwise); without it `default_slots` (the admin's
/// `server_slots`) applies. At most `max_endpoints` ready endpoints are served (the admin's,
/// default [`DEFAULT_MAX_ENDPOINTS`]); a comment counts those left out.
/// `cookies` gives every slot the static persistence cookie `cookie <cookie_prefix>SRV_<n>` (its
/// own name: it stays with the slot when the runtime API moves the slot to another address, and
/// never tells a client a pod's address). The prefix (letters, digits and `-`, at most 16) tells
/// the backends of one Gateway rule apart, so that a cookie also picks the backend.
pub(crate) fn server_lines(
    be_name: &str,
    svc_ns: &str,
    svc_name: &str,
    svc_port: Value,
    options: Kwargs,
) -> Result<Value, Error> {
    let slots: Option<Value> = options.get("slots")?;
    let default_slots: Option<Value> = options.get("default_slots")?;
    let refuse_ranges: Option<Value> = options.get("refuse")?;
    let cookies: Option<Value> = options.get("cookies")?;
    let cookies = cookies.is_some_and(|v| v.is_true());
    let max_endpoints: Option<Value> = options.get("max_endpoints")?;
    let max_endpoints = endpoint_limit(max_endpoints)?;
    let cookie_prefix: Option<Value> = options.get("cookie_prefix")?;
    let cookie_prefix = cookie_prefix
        .filter(|v| !v.is_undefined() && !v.is_none())
        .map(|v| v.to_string())
        .unwrap_or_default();
    if cookie_prefix.len() > 16
        || !cookie_prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(invalid(format!(
            "server_lines: cookie_prefix {cookie_prefix:?} is not letters, digits and '-' (at most 16)"
        )));
    }
    options.assert_all_used()?;
    let slots_min = pool_size(slots, default_slots)?;
    for (what, v) in [
        ("backend", be_name),
        ("namespace", svc_ns),
        ("service", svc_name),
    ] {
        if v.is_empty() || !super::safe::is_plain(v) {
            return Err(invalid(format!(
                "server_lines: {what} name {v:?} is not a plain name"
            ))
            .with_source(super::safe::RefusalMarker));
        }
    }
    let ranges: Vec<Range> = match refuse_ranges {
        Some(v) if !v.is_undefined() && !v.is_none() => v
            .try_iter()?
            .map(|r| Range::parse(r.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        _ => Vec::new(),
    };
    let keys = [svc_ns.to_string(), svc_name.to_string()];
    let (service, slices, current) = units::with_inputs(|stores, current| {
        let services = stores.get("services");
        let service = services.and_then(|s| s.get_one(&keys).ok().flatten());
        let version = services.map_or(0, |s| s.version());
        units::note_store_read(
            "services",
            version,
            StoreMethod::Get,
            &keys,
            service.as_slice(),
        );
        (service, stores.get("endpoints").cloned(), current)
    })
    .ok_or_else(|| invalid("server_lines() can only be used while rendering"))?;

    let port_name = service
        .as_deref()
        .and_then(|svc| service_port_name(svc.root(), &svc_port));
    let mut endpoints = Endpoints::default();
    if let Some(port_name) = &port_name {
        let found: Vec<Arc<Doc>> = slices
            .as_ref()
            .and_then(|s| s.fetch(&keys).ok())
            .unwrap_or_default();
        let version = slices.as_ref().map_or(0, |s| s.version());
        units::note_store_read("endpoints", version, StoreMethod::Fetch, &keys, &found);
        // A dual-stack Service has one EndpointSlice per family, each listing every pod: the
        // Service's first family is used for a pod both list (one server per pod, not two).
        let primary = service
            .as_deref()
            .and_then(|svc| {
                svc.root()
                    .pointer(&["spec", "ipFamilies"])
                    .map(NodeRef::items)
                    .into_iter()
                    .flatten()
                    .next()
            })
            .map_or("IPv4", |f| text(Some(f)));
        endpoints = Endpoints::collect(&found, port_name, &ranges, primary);
    }

    let running = current.as_ref().and_then(|c| c.backend(be_name)).cloned();
    units::note_current_read(be_name, running.as_ref());
    let running = running.map(|b| b.servers).unwrap_or_default();
    endpoints.limit(max_endpoints, &running);
    let slots = assign_slots(&endpoints.keys, &running, slots_min, max_endpoints);

    let mut out = String::with_capacity(40 * slots.len() + 80);
    if service.is_none() {
        let _ = write!(
            out,
            "\n  # service {svc_ns}/{svc_name} not found: every slot is a placeholder"
        );
    } else if port_name.is_none() {
        let port_text = if super::safe::is_plain(&svc_port.to_string()) {
            svc_port.to_string()
        } else {
            "?".to_string()
        };
        let _ = write!(
            out,
            "\n  # service {svc_ns}/{svc_name} has no port {port_text}: \
             every slot is a placeholder"
        );
    }
    endpoints.write_notes(&mut out);
    write_servers(&mut out, &slots, cookies.then_some(cookie_prefix.as_str()));
    Ok(Value::from_safe_string(out))
}

/// `max_endpoints` (the admin's: 1 to [`MAX_ENDPOINTS_LIMIT`]), else [`DEFAULT_MAX_ENDPOINTS`].
fn endpoint_limit(max: Option<Value>) -> Result<usize, Error> {
    let Some(v) = max.filter(|v| !v.is_undefined() && !v.is_none()) else {
        return Ok(DEFAULT_MAX_ENDPOINTS);
    };
    let n = i64::try_from(v.clone())
        .ok()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
    match n {
        Some(n) if (1..=MAX_ENDPOINTS_LIMIT as i64).contains(&n) => Ok(n as usize),
        _ => Err(invalid(format!(
            "server_lines: max_endpoints {v:?} is not an integer from 1 to {MAX_ENDPOINTS_LIMIT}"
        ))),
    }
}

/// The pool's smallest size: `slots` (a tenant's value, 1 to 1024, refused otherwise), else
/// `default_slots` (the installation's), else 10.
fn pool_size(slots: Option<Value>, default_slots: Option<Value>) -> Result<usize, Error> {
    let slots = slots.filter(|v| !v.is_undefined() && !v.is_none());
    Ok(match slots {
        Some(v) => {
            let n = i64::try_from(v.clone())
                .ok()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
            match n {
                Some(n) if (1..=1024).contains(&n) => n as usize,
                _ => {
                    return Err(invalid(format!(
                    "server pool size (scale-server-slots): {v:?} is not an integer from 1 to 1024"
                ))
                    .with_source(super::safe::RefusalMarker))
                }
            }
        }
        None => default_slots
            .and_then(|v| i64::try_from(v).ok())
            .unwrap_or(10)
            .clamp(1, 65536) as usize,
    })
}

/// The name of the Service port the template asked for, by number or by name.
fn service_port_name(service: NodeRef<'_>, wanted: &Value) -> Option<String> {
    let by_number = match wanted.kind() {
        ValueKind::Number => i64::try_from(wanted.clone()).ok(),
        _ => None,
    };
    let by_name = wanted.as_str();
    service
        .pointer(&["spec", "ports"])?
        .items()
        .find(|p| match (by_number, by_name) {
            (Some(n), _) => p.get("port").and_then(NodeRef::as_i64) == Some(n),
            (None, Some(name)) => p.get("name").and_then(NodeRef::as_str) == Some(name),
            _ => false,
        })
        .map(|p| text(p.get("name")).to_string())
}

/// The ready endpoints of a Service port, as sorted `address|port` keys, and what was left out.
#[derive(Debug, Default)]
struct Endpoints {
    /// `address|port`, sorted and without repeats once collected.
    keys: Vec<String>,
    bad_addrs: usize,
    bad_ports: usize,
    /// In the order first met; `refused_seen` holds the same, to answer in constant time (a
    /// tenant's EndpointSlice may carry 100,000 addresses).
    refused: Vec<IpAddr>,
    refused_seen: std::collections::HashSet<IpAddr>,
    /// Ready endpoints left out over the backend's limit, and that limit.
    over: Option<(usize, usize)>,
    /// Endpoints of a pod already taken from the Service's first address family.
    other_family: usize,
}

/// Endpoints one backend serves at most unless the call says otherwise (`max_endpoints`, up to
/// [`MAX_ENDPOINTS_LIMIT`]). HAProxy's own check takes time growing with the square of a
/// backend's servers (0.1 s at 5,000, 1.2 s at 20,000, four minutes at 160,000), and one
/// EndpointSlice may list 100,000 addresses: one tenant's Service must not stall every check.
pub(crate) const DEFAULT_MAX_ENDPOINTS: usize = 8192;
pub(crate) const MAX_ENDPOINTS_LIMIT: usize = 65536;

/// How many of the refused addresses are named, one comment line each.
const REFUSED_NAMED: usize = 16;

impl Endpoints {
    /// The ready endpoints of `slices` on the port named `port_name`. A pod (an endpoint's
    /// `targetRef`) listed in slices of both address families counts once, in `primary`'s;
    /// endpoints without a `targetRef` are all kept.
    fn collect(slices: &[Arc<Doc>], port_name: &str, refuse: &[Range], primary: &str) -> Endpoints {
        let mut out = Endpoints::default();
        // (addressType, slice), the Service's first family first.
        let mut ordered: Vec<(&str, NodeRef<'_>)> = slices
            .iter()
            .map(|s| (text(s.root().get("addressType")), s.root()))
            .collect();
        ordered.sort_by_key(|(family, _)| *family != primary);
        // Only a Service with slices of both families can list a pod twice: the others (all
        // but dual-stack Services) skip the bookkeeping.
        let has = |f: &str| ordered.iter().any(|(family, _)| *family == f);
        let dual = has("IPv4") && has("IPv6");
        // targetRef → the family it was first taken from.
        let mut targets: std::collections::HashMap<String, &str> = Default::default();
        for (family, slice) in ordered {
            if family == "FQDN" {
                continue;
            }
            let ports = slice.get("ports").map(NodeRef::items).into_iter().flatten();
            let Some(port) = ports.into_iter().find(|p| text(p.get("name")) == port_name) else {
                continue;
            };
            let Some(port) = port
                .get("port")
                .and_then(NodeRef::as_u64)
                .filter(|p| (1..=65535).contains(p))
            else {
                out.bad_ports += 1;
                continue;
            };
            let endpoints = slice
                .get("endpoints")
                .map(NodeRef::items)
                .into_iter()
                .flatten();
            for ep in endpoints {
                let ready = ep
                    .pointer(&["conditions", "ready"])
                    .and_then(NodeRef::as_bool);
                if ready == Some(false) {
                    continue;
                }
                let target = ep.get("targetRef").filter(|_| dual).map(|target| {
                    ["kind", "namespace", "name", "uid"]
                        .map(|k| text(target.get(k)))
                        .join("/")
                });
                if let Some(&first) = target.as_ref().and_then(|key| targets.get(key)) {
                    if first != family {
                        out.other_family += 1;
                        continue;
                    }
                }
                let addresses = ep
                    .get("addresses")
                    .map(NodeRef::items)
                    .into_iter()
                    .flatten();
                let mut served = false;
                for addr in addresses {
                    served |= out.add(addr, port, refuse);
                }
                // Only a pod served in this family is skipped in the other: one whose address
                // here is refused or unusable keeps its other family's.
                if let (Some(key), true) = (target, served) {
                    targets.entry(key).or_insert(family);
                }
            }
        }
        out.keys.sort_unstable();
        out.keys.dedup();
        out
    }

    /// Whether the address became a server key.
    fn add(&mut self, addr: NodeRef<'_>, port: u64, refuse: &[Range]) -> bool {
        let Some(ip) = addr.as_str().and_then(|a| a.parse::<IpAddr>().ok()) else {
            self.bad_addrs += 1;
            return false;
        };
        if refuse.iter().any(|r| r.contains(&ip)) {
            if self.refused_seen.insert(ip) {
                self.refused.push(ip);
            }
            return false;
        }
        // The address as written when it is canonical, so keys match current_config. Repeats
        // are removed once all are collected (checking each against all before it was
        // quadratic: seconds for one large EndpointSlice).
        self.keys.push(format!("{ip}|{port}"));
        true
    }

    /// Keeps at most `max` endpoints: those a running server serves first (a limit never moves
    /// traffic off a server that carries it), then the others in order.
    fn limit(&mut self, max: usize, running: &[Server]) {
        let total = self.keys.len();
        if total <= max {
            return;
        }
        let serving: std::collections::HashSet<String> = running
            .iter()
            .filter(|s| s.enabled)
            .filter_map(|s| s.port.map(|p| format!("{}|{p}", s.address)))
            .collect();
        let (mut kept, others): (Vec<String>, Vec<String>) = std::mem::take(&mut self.keys)
            .into_iter()
            .partition(|k| serving.contains(k));
        kept.truncate(max);
        let room = max - kept.len();
        kept.extend(others.into_iter().take(room));
        kept.sort_unstable();
        self.keys = kept;
        self.over = Some((total - max, max));
    }

    /// Comments for what was left out.
    fn write_notes(&self, out: &mut String) {
        if let Some((over, max)) = self.over {
            let _ = write!(
                out,
                "\n  # {over} ready endpoint(s) left out: more than {max} in one backend (max_endpoints)"
            );
        }
        if self.bad_addrs > 0 {
            let _ = write!(
                out,
                "\n  # {} endpoint address(es) left out: not an IPv4/IPv6 address",
                self.bad_addrs
            );
        }
        if self.other_family > 0 {
            let _ = write!(
                out,
                "\n  # {} endpoint(s) of the Service's other address family not used: their pods are served in its first",
                self.other_family
            );
        }
        if self.bad_ports > 0 {
            let _ = write!(
                out,
                "\n  # {} EndpointSlice(s) left out: port not in 1-65535",
                self.bad_ports
            );
        }
        for ip in self.refused.iter().take(REFUSED_NAMED) {
            let _ = write!(out, "\n  # endpoint {ip} refused by refuse_endpoint_ranges");
        }
        if self.refused.len() > REFUSED_NAMED {
            let _ = write!(
                out,
                "\n  # and {} more endpoint(s) refused by refuse_endpoint_ranges",
                self.refused.len() - REFUSED_NAMED
            );
        }
    }
}

/// Slot `n` (1-based; index 0 unused) → the endpoint key it serves. The pool is `slots_min`
/// doubled until the endpoints fit, never smaller than what runs; endpoints keep the slot they
/// run in, the others fill free slots in order.
fn assign_slots(
    endpoints: &[String],
    running: &[Server],
    slots_min: usize,
    max_endpoints: usize,
) -> Vec<Option<String>> {
    let grown = |n: usize| {
        let mut pool = slots_min;
        for _ in 0..24 {
            if pool < n {
                pool *= 2;
            }
        }
        pool
    };
    // Never smaller than what runs (shrinking needs a reload), but never larger than the limit
    // of endpoints needs: a pool that grew before the limit (or before it was lowered) shrinks.
    let pool = grown(endpoints.len()).max(running.len().min(grown(max_endpoints)));

    let mut slots: Vec<Option<String>> = vec![None; pool + 1];
    let mut kept = std::collections::HashSet::new();
    for s in running.iter().filter(|s| s.enabled) {
        let Some(n) = s
            .name
            .strip_prefix("SRV_")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let key = match s.port {
            Some(p) => format!("{}|{p}", s.address),
            None => continue,
        };
        if (1..=pool).contains(&n)
            && slots[n].is_none()
            && endpoints.binary_search(&key).is_ok()
            && kept.insert(key.clone())
        {
            slots[n] = Some(key);
        }
    }
    let mut free = endpoints.iter().filter(|k| !kept.contains(*k));
    for slot in slots.iter_mut().skip(1) {
        if slot.is_none() {
            *slot = free.next().cloned();
        }
    }
    slots
}

/// One `server` line per slot: the endpoint, or a disabled placeholder.
/// `cookies`: the prefix of each slot's static cookie, or no cookies.
fn write_servers(out: &mut String, slots: &[Option<String>], cookies: Option<&str>) {
    for (i, slot) in slots.iter().enumerate().skip(1) {
        match slot {
            None => {
                let _ = write!(out, "\n  server SRV_{i} 127.0.0.1:1 disabled");
            }
            Some(key) => {
                let (addr, port) = key.split_once('|').unwrap_or((key, ""));
                if addr.contains(':') {
                    let _ = write!(out, "\n  server SRV_{i} [{addr}]:{port} enabled");
                } else {
                    let _ = write!(out, "\n  server SRV_{i} {addr}:{port} enabled");
                }
            }
        }
        if let Some(prefix) = cookies {
            let _ = write!(out, " cookie {prefix}SRV_{i}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_cookies_name_every_slot() {
        let slots = [None, Some("10.0.0.1|8080".to_string()), None];
        let mut out = String::new();
        write_servers(&mut out, &slots, Some(""));
        assert_eq!(
            out,
            "\n  server SRV_1 10.0.0.1:8080 enabled cookie SRV_1\n  server SRV_2 127.0.0.1:1 disabled cookie SRV_2"
        );
        let mut out = String::new();
        write_servers(&mut out, &slots, Some("b1-"));
        assert!(out.contains(" cookie b1-SRV_1\n"), "{out}");
        let mut out = String::new();
        write_servers(&mut out, &slots, None);
        assert!(!out.contains("cookie"), "{out}");
    }

    /// Over the limit, endpoints that running servers serve are kept first, then the others
    /// in order; a comment counts what is left out. Refused addresses are named up to a bound.
    #[test]
    fn endpoints_over_the_limit_keep_the_running_ones() {
        let key = |i: usize| format!("10.0.0.{i}|8080");
        // Sorted, as `collect` leaves them.
        let mut keys: Vec<String> = (1..=10).map(key).collect();
        keys.sort();
        let mut e = Endpoints {
            keys,
            ..Endpoints::default()
        };
        let server = |name: &str, i: usize, enabled: bool| Server {
            name: name.to_string(),
            address: format!("10.0.0.{i}"),
            port: Some(8080),
            enabled,
        };
        let running = [
            server("SRV_1", 9, true),
            server("SRV_2", 7, true),
            server("SRV_3", 2, false),
        ];
        e.limit(4, &running);
        // 7 and 9 run; then the first two others in order ("10.0.0.10|…" sorts first).
        let mut expected = vec![key(10), key(1), key(7), key(9)];
        expected.sort();
        assert_eq!(e.keys, expected);
        let mut notes = String::new();
        e.write_notes(&mut notes);
        assert_eq!(
            notes,
            "\n  # 6 ready endpoint(s) left out: more than 4 in one backend (max_endpoints)"
        );
        // Under the limit: all kept, nothing said.
        let mut e = Endpoints {
            keys: (1..=4).map(key).collect(),
            ..Endpoints::default()
        };
        e.limit(4, &running);
        assert_eq!(e.keys.len(), 4);
        assert!(e.over.is_none());

        let mut e = Endpoints::default();
        for i in 0..40 {
            let ip: IpAddr = format!("127.0.0.{}", i % 20).parse().unwrap();
            if e.refused_seen.insert(ip) {
                e.refused.push(ip);
            }
        }
        let mut notes = String::new();
        e.write_notes(&mut notes);
        assert_eq!(notes.lines().count(), 1 + REFUSED_NAMED + 1, "{notes}");
        assert!(
            notes.ends_with("# and 4 more endpoint(s) refused by refuse_endpoint_ranges"),
            "{notes}"
        );
    }

    /// A pool that grew larger than the endpoint limit needs (before the limit, or before it
    /// was lowered) shrinks to what the limit needs; under it, the running pool is kept.
    #[test]
    fn a_pool_never_outgrows_the_endpoint_limit() {
        let running: Vec<Server> = (1..=100)
            .map(|n| Server {
                name: format!("SRV_{n}"),
                address: format!("10.0.0.{n}"),
                port: Some(8080),
                enabled: true,
            })
            .collect();
        let mut keys: Vec<String> = (1..=3).map(|n| format!("10.0.0.{n}|8080")).collect();
        keys.sort();
        // Limit 8 from a minimum of 2: a pool of 8, the running endpoints in their slots.
        let slots = assign_slots(&keys, &running, 2, 8);
        assert_eq!(slots.len(), 8 + 1);
        assert_eq!(slots[1].as_deref(), Some("10.0.0.1|8080"));
        // A limit above what runs keeps the running pool.
        assert_eq!(assign_slots(&keys, &running, 2, 1000).len(), 100 + 1);
    }

    #[test]
    fn ranges_contain_what_they_say() {
        let r = Range::parse("127.0.0.0/8").unwrap();
        assert!(r.contains(&"127.1.2.3".parse().unwrap()));
        assert!(!r.contains(&"128.0.0.1".parse().unwrap()));
        assert!(!r.contains(&"::1".parse().unwrap()));
        let r = Range::parse("fe80::/10").unwrap();
        assert!(r.contains(&"fe80::1".parse().unwrap()));
        assert!(!r.contains(&"fec0::1".parse().unwrap()));
        assert!(Range::parse("0.0.0.0/0")
            .unwrap()
            .contains(&"8.8.8.8".parse().unwrap()));
        assert!(Range::parse("10.0.0.1")
            .unwrap()
            .contains(&"10.0.0.1".parse().unwrap()));
        assert!(Range::parse("10.0.0.0/33").is_err());
        assert!(Range::parse("x").is_err());
        assert!(Range::parse("127.0.0.0/8")
            .unwrap()
            .contains(&"::ffff:127.0.0.5".parse().unwrap()));
    }
}
