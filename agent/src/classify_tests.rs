//! Unit tests of the classifier: one case per row of the runtime/reload table.

use super::*;

const BASE: &str = "\
global
    stats socket /run/haproxy/worker.sock level admin
defaults
    mode http
frontend fe
    bind :80
    bind :443 ssl crt-list /etc/haproxy/ssl/list.txt
    use_backend %[req.hdr(host),lower,map(/etc/haproxy/maps/host.map,be_default)]
backend be_default
    server SRV_1 10.0.0.1:8080 enabled weight 10  # Pod: web-1
    server SRV_2 127.0.0.1:1 disabled weight 10
";

fn bundle(cfg: &str, files: &[(FileKind, &str, &str)]) -> Bundle {
    let files = files
        .iter()
        .map(|(kind, path, content)| BundleFile {
            kind: *kind,
            path: (*path).into(),
            content: content.as_bytes().to_vec(),
        })
        .collect();
    Bundle::new(cfg.to_string(), files)
}

fn base_files(map: &str, list: &str) -> Vec<(FileKind, &'static str, String)> {
    vec![
        (FileKind::Map, "maps/host.map", map.to_string()),
        (FileKind::CrtList, "ssl/list.txt", list.to_string()),
        (FileKind::Cert, "ssl/default.pem", "CERT-A\nKEY-A\n".into()),
        (FileKind::Cert, "ssl/b.pem", "CERT-B\n".into()),
    ]
}

fn with(cfg: &str, map: &str, list: &str, extra: &[(FileKind, &str, &str)]) -> Bundle {
    let mut files: Vec<(FileKind, String, String)> = base_files(map, list)
        .into_iter()
        .map(|(k, p, c)| (k, p.to_string(), c))
        .collect();
    for (k, p, c) in extra {
        files.retain(|(_, path, _)| path != p);
        files.push((*k, p.to_string(), c.to_string()));
    }
    let refs: Vec<(FileKind, &str, &str)> = files
        .iter()
        .map(|(k, p, c)| (*k, p.as_str(), c.as_str()))
        .collect();
    bundle(cfg, &refs)
}

const MAP: &str = "a.example be_default\n";
const LIST: &str = "/etc/haproxy/ssl/default.pem\n/etc/haproxy/ssl/b.pem b.example\n";

fn old() -> Bundle {
    with(BASE, MAP, LIST, &[])
}

fn reasons(c: &Classification) -> String {
    c.reasons().join("; ")
}

#[test]
fn comments_and_whitespace_are_no_change() {
    let cfg = BASE
        .replace("# Pod: web-1", "# Pod: web-7")
        .replace("    bind :80", "\tbind   :80 # plain");
    assert_eq!(
        classify(&old(), &with(&cfg, MAP, LIST, &[])),
        Classification::NoChange
    );
}

#[test]
fn endpoint_move_and_placeholder_enable_order_addr_before_ready() {
    let cfg = BASE
        .replace(
            "SRV_1 10.0.0.1:8080 enabled weight 10",
            "SRV_1 10.0.0.9:8081 enabled weight 10",
        )
        .replace(
            "SRV_2 127.0.0.1:1 disabled weight 10",
            "SRV_2 10.0.0.2:8080 enabled weight 20",
        );
    let c = classify(&old(), &with(&cfg, MAP, LIST, &[]));
    assert_eq!(
        c.commands(),
        [
            "set server be_default/SRV_1 addr 10.0.0.9 port 8081",
            "set server be_default/SRV_2 addr 10.0.0.2 port 8080",
            "set server be_default/SRV_2 weight 20",
            "set server be_default/SRV_2 state ready",
        ]
    );
    assert_eq!(c.result_name(), "runtime");
}

#[test]
fn disable_goes_to_maint_before_moving_address() {
    let cfg = BASE.replace("SRV_1 10.0.0.1:8080 enabled", "SRV_1 127.0.0.1:1 disabled");
    let c = classify(&old(), &with(&cfg, MAP, LIST, &[]));
    assert_eq!(
        c.commands(),
        [
            "set server be_default/SRV_1 state maint",
            "set server be_default/SRV_1 addr 127.0.0.1 port 1"
        ]
    );
}

#[test]
fn slot_growth_and_other_server_keywords_reload() {
    let grown = BASE.replace(
        "    server SRV_2",
        "    server SRV_3 127.0.0.1:1 disabled\n    server SRV_2",
    );
    let c = classify(&old(), &with(&grown, MAP, LIST, &[]));
    assert!(reasons(&c).contains("lines added or removed"), "{c:?}");
    let check = BASE.replace(
        "SRV_1 10.0.0.1:8080 enabled",
        "SRV_1 10.0.0.1:8080 enabled check",
    );
    assert!(
        reasons(&classify(&old(), &with(&check, MAP, LIST, &[]))).contains("keyword other than")
    );
    let fqdn = BASE.replace("10.0.0.1:8080", "web.example:8080");
    assert!(reasons(&classify(&old(), &with(&fqdn, MAP, LIST, &[]))).contains("not an IP:port"));
    let renamed = BASE.replace("SRV_1 10.0.0.1", "SRV_9 10.0.0.1");
    assert_eq!(
        classify(&old(), &with(&renamed, MAP, LIST, &[])).result_name(),
        "reload"
    );
    let weight = BASE.replace("enabled weight 10", "enabled weight 999");
    assert_eq!(
        classify(&old(), &with(&weight, MAP, LIST, &[])).result_name(),
        "reload"
    );
}

#[test]
fn structural_changes_reload_with_reasons() {
    let c = classify(
        &old(),
        &with(&BASE.replace("mode http", "mode tcp"), MAP, LIST, &[]),
    );
    assert_eq!(
        reasons(&c),
        "defaults: line \"mode http\" became \"mode tcp\""
    );
    let c = classify(
        &old(),
        &with(&format!("{BASE}backend be_new\n"), MAP, LIST, &[]),
    );
    assert_eq!(reasons(&c), "section added: backend be_new");
}

#[test]
fn map_content_change_is_an_atomic_runtime_replace() {
    let c = classify(
        &old(),
        &with(
            BASE,
            "a.example be_default\nb.example be_default\n",
            LIST,
            &[],
        ),
    );
    assert_eq!(
        c,
        Classification::Runtime(vec![RuntimeAction::ReplaceMap {
            name: "/etc/haproxy/maps/host.map".into(),
            path: "maps/host.map".into(),
            parsed: false,
        }])
    );
}

#[test]
fn map_used_as_acl_pattern_file_reloads() {
    let cfg = BASE.replace(
        "    bind :80\n",
        "    bind :80\n    acl x hdr(host) -f /etc/haproxy/maps/host.map\n",
    );
    let o = with(&cfg, MAP, LIST, &[]);
    let n = with(&cfg, "b.example x\n", LIST, &[]);
    assert!(reasons(&classify(&o, &n)).contains("other than as a map"));
}

#[test]
fn loaded_certificate_content_swap_is_runtime() {
    let n = with(
        BASE,
        MAP,
        LIST,
        &[(FileKind::Cert, "ssl/b.pem", "CERT-B2\n")],
    );
    assert_eq!(
        classify(&old(), &n).commands(),
        [
            "set ssl cert /etc/haproxy/ssl/b.pem <<(content of ssl/b.pem)",
            "commit ssl cert /etc/haproxy/ssl/b.pem"
        ]
    );
}

#[test]
fn crt_list_append_with_new_cert_and_removal_are_runtime() {
    let list = "/etc/haproxy/ssl/default.pem\n/etc/haproxy/ssl/c.pem [alpn h2] c.example\n";
    let n = with(
        BASE,
        MAP,
        list,
        &[(FileKind::Cert, "ssl/c.pem", "CERT-C\n")],
    );
    assert_eq!(
        classify(&old(), &n).commands(),
        [
            "new ssl cert /etc/haproxy/ssl/c.pem",
            "set ssl cert /etc/haproxy/ssl/c.pem <<(content of ssl/c.pem)",
            "commit ssl cert /etc/haproxy/ssl/c.pem",
            "del ssl crt-list /etc/haproxy/ssl/list.txt /etc/haproxy/ssl/b.pem",
            "add ssl crt-list /etc/haproxy/ssl/list.txt <<(/etc/haproxy/ssl/c.pem [alpn h2] c.example)",
            "del ssl cert /etc/haproxy/ssl/b.pem",
        ]
    );
}

#[test]
fn crt_list_first_line_or_order_change_reloads() {
    let swapped = "/etc/haproxy/ssl/b.pem b.example\n/etc/haproxy/ssl/default.pem\n";
    assert!(reasons(&classify(&old(), &with(BASE, MAP, swapped, &[]))).contains("first line"));
    let three =
        "/etc/haproxy/ssl/default.pem\n/etc/haproxy/ssl/b.pem b.example\n/etc/haproxy/ssl/c.pem\n";
    let o = with(BASE, MAP, three, &[(FileKind::Cert, "ssl/c.pem", "C\n")]);
    let reordered =
        "/etc/haproxy/ssl/default.pem\n/etc/haproxy/ssl/c.pem\n/etc/haproxy/ssl/b.pem b.example\n";
    let n = with(
        BASE,
        MAP,
        reordered,
        &[(FileKind::Cert, "ssl/c.pem", "C\n")],
    );
    assert!(reasons(&classify(&o, &n)).contains("reordered"));
}

#[test]
fn general_file_change_reloads_unreferenced_files_are_disk_only() {
    let cfg = BASE.replace(
        "    bind :80\n",
        "    bind :80\n    errorfile 503 /etc/haproxy/general/503.http\n",
    );
    let o = with(
        &cfg,
        MAP,
        LIST,
        &[(FileKind::General, "general/503.http", "HTTP/1.0 503\n")],
    );
    let n = with(
        &cfg,
        MAP,
        LIST,
        &[(FileKind::General, "general/503.http", "HTTP/1.0 503 x\n")],
    );
    assert!(reasons(&classify(&o, &n)).contains("general file general/503.http changed"));
    let added = with(
        &cfg,
        MAP,
        LIST,
        &[
            (FileKind::General, "general/503.http", "HTTP/1.0 503\n"),
            (FileKind::General, "general/x", "x"),
        ],
    );
    assert_eq!(classify(&o, &added), Classification::Runtime(vec![]));
    assert_eq!(classify(&added, &o), Classification::Runtime(vec![]));
}

#[test]
fn certificate_loaded_through_directory_reloads() {
    let cfg = BASE.replace(
        "crt-list /etc/haproxy/ssl/list.txt",
        "crt /etc/haproxy/ssl/",
    );
    let o = with(&cfg, MAP, LIST, &[]);
    let n = with(&cfg, MAP, LIST, &[(FileKind::Cert, "ssl/b.pem", "NEW\n")]);
    assert!(reasons(&classify(&o, &n)).contains("through its directory"));
}

#[test]
fn removed_file_still_referenced_reloads() {
    let mut n = old();
    n.files.retain(|f| f.path != "maps/host.map");
    assert!(reasons(&classify(&old(), &n)).contains("still referenced"));
}

/// The windowed comparison (only the differing sections parsed) gives exactly the full
/// comparison's result, over many random edits of a many-section configuration: server
/// changes (runtime), other line changes, added and removed lines, sections added, removed and
/// renamed, edits at the very start and end, and edits in two distant sections at once.
/// The `r`-th server line (modulo their count) and its server's name.
fn some_server(lines: &[String], r: usize) -> Option<(usize, String)> {
    let servers: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("  server "))
        .collect();
    let i = *servers.get(r % servers.len().max(1))?;
    let name = lines[i].split_whitespace().nth(1)?.to_string();
    Some((i, name))
}

#[test]
fn windowed_classification_equals_the_full_comparison() {
    fn base(backends: usize) -> Vec<String> {
        let mut lines = vec![
            "# generated".to_string(),
            "global".into(),
            "  maxconn 100".into(),
            "defaults".into(),
            "  mode http".into(),
            "frontend http".into(),
            "  bind :80".into(),
            "  use_backend %[var(txn.backend)]".into(),
        ];
        for b in 0..backends {
            lines.push(format!("backend be{b}"));
            lines.push("  balance roundrobin".into());
            for s in 1..=3 {
                lines.push(format!(
                    "  server SRV_{s} 10.0.{b}.{s}:80 weight 10 enabled"
                ));
            }
            lines.push(String::new());
        }
        lines
    }
    let mut seed: u64 = 0x9e3779b97f4a7c15;
    let mut rand = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let edits: &[fn(&mut Vec<String>, usize, usize)] = &[
        |l, _, r| {
            // A server's address (runtime class), in a random backend.
            if let Some((i, name)) = some_server(l, r) {
                l[i] = format!("  server {name} 10.9.{r}.1:8080 weight 10 enabled");
            }
        },
        |l, _, r| {
            // A server's weight and state (runtime class).
            if let Some((i, name)) = some_server(l, r) {
                l[i] = format!(
                    "  server {name} 10.0.0.2:80 weight {} disabled",
                    1 + r % 200
                );
            }
        },
        |l, i, _| l[i] = "  balance leastconn".into(),
        |l, i, _| {
            l.remove(i);
        },
        |l, i, r| l.insert(i, format!("  timeout server {r}s")),
        |l, i, r| l.insert(i, format!("backend added{r}")),
        |l, i, r| l[i] = format!("backend renamed{r}"),
        |l, i, _| l[i] = "  # a comment".into(),
        |l, _, r| l.insert(0, format!("# header {r}")),
        |l, _, r| l.push(format!("backend last{r}")),
        |l, _, _| {
            l.pop();
        },
    ];
    let mut runtime = 0;
    for round in 0..400 {
        let old_lines = base(20);
        let mut new_lines = old_lines.clone();
        for _ in 0..1 + round % 3 {
            let i = rand(new_lines.len().max(1)).min(new_lines.len().saturating_sub(1));
            let r = rand(250);
            let edit = edits[rand(edits.len())];
            edit(&mut new_lines, i, r);
        }
        let old = Bundle::new(old_lines.join("\n") + "\n", vec![]);
        let new = Bundle::new(new_lines.join("\n") + "\n", vec![]);
        let windowed = classify(&old, &new);
        let full = classify_full(&old, &new);
        assert_eq!(windowed, full, "round {round}:\n{}", new.haproxy_cfg);
        runtime += matches!(full, Classification::Runtime(_)) as usize;
    }
    assert!(
        runtime > 20,
        "the edits include runtime-class changes ({runtime})"
    );
}

/// haproxy -c vets reloads, certificate material (a key that does not match its certificate is
/// refused by HAProxy, not by templates) and maps HAProxy parses (regular expressions,
/// addresses, numbers); never server changes, maps of plain strings, nor a removal.
#[test]
fn certificates_parsed_maps_and_reloads_need_the_check_servers_and_string_maps_do_not() {
    let swap = with(
        BASE,
        MAP,
        LIST,
        &[(FileKind::Cert, "ssl/b.pem", "CERT-B2\n")],
    );
    assert!(classify(&old(), &swap).needs_check());
    let added = with(
        BASE,
        MAP,
        "/etc/haproxy/ssl/default.pem\n/etc/haproxy/ssl/b.pem\n/etc/haproxy/ssl/c.pem c.example\n",
        &[(FileKind::Cert, "ssl/c.pem", "CERT-C\n")],
    );
    assert!(classify(&old(), &added).needs_check());
    let map = with(BASE, "b.example be_default\n", LIST, &[]);
    assert!(matches!(classify(&old(), &map), Classification::Runtime(_)));
    assert!(!classify(&old(), &map).needs_check());
    let removed = with(BASE, MAP, "/etc/haproxy/ssl/default.pem\n", &[]);
    let class = classify(&old(), &removed);
    assert!(matches!(class, Classification::Runtime(_)), "{class:?}");
    assert!(!class.needs_check(), "{class:?}");
    assert!(!classify(&old(), &old()).needs_check());
    let reload = with(&BASE.replace("bind :80", "bind :81"), MAP, LIST, &[]);
    assert!(classify(&old(), &reload).needs_check());
    // A map HAProxy parses: regular expressions, addresses, numbers.
    for converter in [
        "map_reg",
        "map_regm",
        "map_ip",
        "map_int",
        "map_str_int",
        "map_beg_ip",
    ] {
        let cfg = BASE.replace("map(/etc", &format!("{converter}(/etc"));
        let (o, n) = (
            with(&cfg, MAP, LIST, &[]),
            with(&cfg, "^b\\. x\n", LIST, &[]),
        );
        let class = classify(&o, &n);
        assert!(
            matches!(class, Classification::Runtime(_)),
            "{converter}: {class:?}"
        );
        assert!(class.needs_check(), "{converter}");
    }
    for converter in [
        "map_str",
        "map_beg",
        "map_end",
        "map_dom",
        "map_sub",
        "map_dir",
        "map_beg_str",
    ] {
        let cfg = BASE.replace("map(/etc", &format!("{converter}(/etc"));
        let (o, n) = (with(&cfg, MAP, LIST, &[]), with(&cfg, "b x\n", LIST, &[]));
        assert!(!classify(&o, &n).needs_check(), "{converter}");
    }
}
