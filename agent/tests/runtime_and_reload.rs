//! Bundles applied to a real HAProxy 2.6 through the agent: runtime-class changes keep the worker,
//! reload-class changes replace it without dropping traffic, and failures leave HAProxy and the
//! disk as they were.

mod support;

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use haptic_agent::protocol::{api, Bundle, FileKind};
use serde_json::Value;
use support::*;

/// haproxy.cfg with a host-map frontend, backend `be_a` with the given server lines and `be_b`.
fn config(env: &Env, be_a: &[String], b1: u16, extra: &str) -> String {
    let servers: String = be_a.iter().map(|s| format!("    {s}\n")).collect();
    format!(
        "{}frontend fe\n    bind {}\n    use_backend %[req.hdr(host),lower,map({}/maps/host.map,be_a)]\nbackend be_a\n    balance roundrobin\n{servers}backend be_b\n    server SRV_1 127.0.0.1:{b1} enabled\n{extra}",
        env.global(),
        env.fe,
        env.cfg_dir.display()
    )
}

fn bundle(cfg: String, map: &str) -> Bundle {
    Bundle::new(cfg, vec![file(FileKind::Map, "maps/host.map", map)])
}

/// After a failed reload: the worker from before is still the current one, and still serves.
fn assert_old_worker_serves(env: &Env, pid: u32) {
    assert_eq!(
        env.worker_pid(),
        pid,
        "the old worker is still the current one"
    );
    assert_eq!(
        http_get(&env.fe, "a.example").unwrap(),
        "a1",
        "and still serves"
    );
}

#[test]
fn endpoint_moves_through_slots_are_runtime_and_keep_the_worker() {
    let env = Env::start(Options::default());
    let (a1, a2, b1) = (backend("a1"), backend("a2"), backend("b1"));
    assert_eq!(
        probe(&env.ip, env.probe_port, "/readyz").unwrap().0,
        503,
        "not ready before the first bundle"
    );

    let v1 = config(
        &env,
        &[
            format!("server SRV_1 127.0.0.1:{a1} enabled weight 10 # Pod: a1"),
            "server SRV_2 127.0.0.1:1 disabled weight 10".into(),
        ],
        b1,
        "",
    );
    env.apply(&bundle(v1, ""), "reload");
    assert_eq!(http_get(&env.fe, "a.example").unwrap(), "a1");
    assert_eq!(probe(&env.ip, env.probe_port, "/readyz").unwrap().0, 200);
    let pid = env.worker_pid();

    // a1 goes away (slot 1 back to its placeholder), a2 arrives in slot 2.
    let v2 = config(
        &env,
        &[
            "server SRV_1 127.0.0.1:1 disabled weight 10".into(),
            format!("server SRV_2 127.0.0.1:{a2} enabled weight 10 # Pod: a2"),
        ],
        b1,
        "",
    );
    let reply = env.apply(&bundle(v2, ""), "runtime");
    assert_eq!(
        reply["commands"],
        serde_json::json!([
            "set server be_a/SRV_1 state maint",
            "set server be_a/SRV_1 addr 127.0.0.1 port 1",
            format!("set server be_a/SRV_2 addr 127.0.0.1 port {a2}"),
            "set server be_a/SRV_2 state ready",
        ])
    );
    assert_eq!(reply["worker_pid_before"], reply["worker_pid_after"]);
    assert_eq!(env.worker_pid(), pid, "a runtime change must not reload");
    // Server changes only, against a checked configuration: no `haproxy -c`.
    assert!(
        reply["timings_ms"].get("validate").is_none(),
        "server-only change checked again: {reply:#}"
    );
    for _ in 0..6 {
        assert_eq!(http_get(&env.fe, "a.example").unwrap(), "a2");
    }

    // Weight only, and a comment change (pod renamed): runtime, then nothing.
    let v3 = config(
        &env,
        &[
            "server SRV_1 127.0.0.1:1 disabled weight 10".into(),
            format!("server SRV_2 127.0.0.1:{a2} enabled weight 20 # Pod: a2"),
        ],
        b1,
        "",
    );
    env.apply(&bundle(v3, ""), "runtime");
    assert!(
        env.runtime("get weight be_a/SRV_2").starts_with("20 "),
        "weight applied at runtime"
    );
    let v4 = config(
        &env,
        &[
            "server SRV_1 127.0.0.1:1 disabled weight 10".into(),
            format!("server SRV_2 127.0.0.1:{a2} enabled weight 20 # Pod: a2-renamed"),
        ],
        b1,
        "",
    );
    env.apply(&bundle(v4.clone(), ""), "no_change");
    assert_eq!(
        env.disk("haproxy.cfg").unwrap(),
        v4,
        "the new text is on disk even when HAProxy needs nothing"
    );
    assert_eq!(env.worker_pid(), pid);
}

#[test]
fn map_replace_uses_prepare_and_commit_and_changes_routing() {
    let env = Env::start(Options {
        worker_socket: true,
        ..Options::default()
    });
    let (a1, b1) = (backend("a1"), backend("b1"));
    let cfg = config(
        &env,
        &[format!("server SRV_1 127.0.0.1:{a1} enabled")],
        b1,
        "",
    );
    env.apply(&bundle(cfg.clone(), "b.example be_a\n"), "reload");
    assert_eq!(http_get(&env.fe, "b.example").unwrap(), "a1");
    let pid = env.worker_pid();

    let map = "# routes\nb.example be_b\n\nc.example be_b\n";
    let reply = env.apply(&bundle(cfg.clone(), map), "runtime");
    // A map's content is parsed only by `haproxy -c`: checked even though it is runtime.
    assert!(reply["timings_ms"].get("validate").is_some(), "{reply:#}");
    assert!(
        reply["commands"][0]
            .as_str()
            .unwrap()
            .starts_with("prepare map"),
        "{reply:#}"
    );
    let map_name = format!("{}/maps/host.map", env.cfg_dir.display());
    let shown = env.runtime(&format!("show map {map_name}"));
    let entries: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, kv)| kv))
        .collect();
    assert_eq!(
        entries,
        ["b.example be_b", "c.example be_b"],
        "show map equals the file"
    );
    assert_eq!(env.disk("maps/host.map").unwrap(), map);
    assert_eq!(http_get(&env.fe, "b.example").unwrap(), "b1");
    assert_eq!(http_get(&env.fe, "c.example").unwrap(), "b1");
    assert_eq!(env.worker_pid(), pid);

    // Larger than one tune.bufsize: sent in chunks.
    let big: String = (0..2000)
        .map(|i| format!("host{i}.example be_b\n"))
        .collect();
    let reply = env.apply(&bundle(cfg, &big), "runtime");
    let adds = reply["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.as_str().unwrap().starts_with("add map"))
        .count();
    assert!(adds > 1, "large map sent in several payloads: {reply:#}");
    assert_eq!(
        env.runtime(&format!("show map {map_name}"))
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
        2000
    );
    assert_eq!(http_get(&env.fe, "host1999.example").unwrap(), "b1");
    assert_eq!(
        http_get(&env.fe, "c.example").unwrap(),
        "a1",
        "removed entry falls back to the default"
    );
    assert_eq!(env.worker_pid(), pid);
}

#[test]
fn certificate_swap_and_crt_list_edits_are_runtime() {
    let env = Env::start(Options::default());
    let (a1, b1) = (backend("a1"), backend("b1"));
    // HAProxy binds with SO_REUSEPORT: the TLS frontend gets an address of its own.
    let tls_addr = format!("{}:8443", unique_loopback());
    let dir = env.cfg_dir.display().to_string();
    let tls = format!("frontend fe_tls\n    bind {tls_addr} ssl crt-list {dir}/ssl/list.txt\n    http-request return status 200 content-type text/plain string tls\n");
    let cfg = config(
        &env,
        &[format!("server SRV_1 127.0.0.1:{a1} enabled")],
        b1,
        &tls,
    );
    let default_pem = server_pem("default-cert");
    let list = format!("{dir}/ssl/default.pem\n{dir}/ssl/site.pem site.example\n");
    let make = |site: &str, list: &str, extra: Option<&str>| {
        let mut files = vec![
            file(FileKind::Map, "maps/host.map", ""),
            file(FileKind::Cert, "ssl/default.pem", &default_pem),
            file(FileKind::Cert, "ssl/site.pem", site),
            file(FileKind::CrtList, "ssl/list.txt", list),
        ];
        if let Some(pem) = extra {
            files.push(file(FileKind::Cert, "ssl/extra.pem", pem));
        }
        Bundle::new(cfg.clone(), files)
    };
    env.apply(&make(&server_pem("site-one"), &list, None), "reload");
    assert!(served_subject(&tls_addr, "site.example").contains("site-one"));
    let pid = env.worker_pid();

    env.apply(&make(&server_pem("site-two"), &list, None), "runtime");
    assert!(
        served_subject(&tls_addr, "site.example").contains("site-two"),
        "new certificate served"
    );
    assert_eq!(env.worker_pid(), pid, "no reload for a certificate swap");

    let site = server_pem("site-two");
    let extra = server_pem("extra-cert");
    let appended = format!("{list}{dir}/ssl/extra.pem extra.example\n");
    let reply = env.apply(&make(&site, &appended, Some(&extra)), "runtime");
    assert!(
        reply["commands"][0]
            .as_str()
            .unwrap()
            .starts_with("new ssl cert"),
        "{reply:#}"
    );
    assert!(served_subject(&tls_addr, "extra.example").contains("extra-cert"));

    let reply = env.apply(&make(&site, &list, None), "runtime");
    assert!(
        reply["commands"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().starts_with("del ssl cert")),
        "{reply:#}"
    );
    assert!(
        served_subject(&tls_addr, "extra.example").contains("default-cert"),
        "removed entry no longer served"
    );
    assert!(
        env.disk("ssl/extra.pem").is_none(),
        "stale certificate deleted"
    );
    assert_eq!(env.worker_pid(), pid);
}

#[test]
fn structural_change_reloads_without_dropping_requests() {
    let env = Env::start(Options::default());
    let (a1, b1, c1) = (backend("a1"), backend("b1"), backend("c1"));
    let servers = [format!("server SRV_1 127.0.0.1:{a1} enabled")];
    env.apply(&bundle(config(&env, &servers, b1, ""), ""), "reload");
    let pid = env.worker_pid();

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let port = env.fe.clone();
    let looper = {
        let (stop, served) = (stop.clone(), served.clone());
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match http_get(&port, "a.example") {
                    Ok(body) if body == "a1" => {
                        served.fetch_add(1, Ordering::SeqCst);
                    }
                    other => errors.push(format!("{other:?}")),
                }
            }
            errors
        })
    };
    wait_for("requests before the reload", Duration::from_secs(5), || {
        (served.load(Ordering::SeqCst) >= 10).then_some(())
    });
    let extra = format!("backend be_c\n    server SRV_1 127.0.0.1:{c1} enabled\n");
    let reply = env.apply(
        &bundle(config(&env, &servers, b1, &extra), "c.example be_c\n"),
        "reload",
    );
    assert!(
        reply["reasons"][0]
            .as_str()
            .unwrap()
            .contains("section added: backend be_c"),
        "{reply:#}"
    );
    let new_pid = env.worker_pid();
    assert_ne!(new_pid, pid, "a reload brings a new worker");
    assert_eq!(reply["worker_pid_after"], new_pid);
    let after = served.load(Ordering::SeqCst);
    wait_for("requests after the reload", Duration::from_secs(5), || {
        (served.load(Ordering::SeqCst) >= after + 10).then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    let errors = looper.join().unwrap();
    assert!(
        errors.is_empty(),
        "requests failed during the reload: {errors:?}"
    );
    assert_eq!(http_get(&env.fe, "c.example").unwrap(), "c1");
}

#[test]
fn invalid_config_is_refused_and_nothing_changes() {
    let env = Env::start(Options::default());
    let (a1, b1) = (backend("a1"), backend("b1"));
    let servers = [format!("server SRV_1 127.0.0.1:{a1} enabled")];
    let v1 = bundle(config(&env, &servers, b1, ""), "b.example be_b\n");
    env.apply(&v1, "reload");
    let pid = env.worker_pid();
    let cfg_before = env.disk("haproxy.cfg").unwrap();

    let bad_cfg = config(
        &env,
        &servers,
        b1,
        "backend be_x\n    no_such_keyword here\n",
    );
    let bad = Bundle::new(
        bad_cfg,
        vec![
            file(FileKind::Map, "maps/host.map", "x.example be_a\n"),
            file(FileKind::General, "general/new.http", "HTTP/1.0 200\n"),
        ],
    );
    let (status, body) = env.put(&bad);
    assert_eq!(status, 422, "{body:#}");
    assert_eq!(body["error"], "invalid_config");
    assert!(
        body["check_output"]
            .as_str()
            .unwrap()
            .contains("no_such_keyword"),
        "{body:#}"
    );
    assert_eq!(env.disk("haproxy.cfg").unwrap(), cfg_before);
    assert_eq!(env.disk("maps/host.map").unwrap(), "b.example be_b\n");
    assert!(
        env.disk("general/new.http").is_none(),
        "files of a refused bundle are removed"
    );
    assert!(env.disk("haproxy.cfg.next").is_none());
    assert_eq!(env.worker_pid(), pid);
    let state = env.state();
    assert_eq!(state["bundle"], v1.hash().as_str());
    assert_eq!(state["last_apply"]["status"], 422);
    assert_eq!(http_get(&env.fe, "b.example").unwrap(), "b1");
}

#[test]
fn reload_failure_rolls_back_and_the_old_worker_keeps_serving() {
    let env = Env::start(Options::default());
    let (a1, b1) = (backend("a1"), backend("b1"));
    let servers = [format!("server SRV_1 127.0.0.1:{a1} enabled")];
    let v1 = bundle(config(&env, &servers, b1, ""), "");
    env.apply(&v1, "reload");
    let pid = env.worker_pid();
    let cfg_before = env.disk("haproxy.cfg").unwrap();

    // `haproxy -c` does not bind, so a port held by someone else (without SO_REUSEPORT) only
    // fails at reload.
    let blocker = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let extra = format!(
        "frontend fe_taken\n    bind 127.0.0.1:{taken}\n    http-request return status 200\n"
    );
    let v2 = Bundle::new(
        config(&env, &servers, b1, &extra),
        vec![file(FileKind::Map, "maps/host.map", "z.example be_b\n")],
    );
    let (status, body) = env.put(&v2);
    assert_eq!(status, 502, "{body:#}");
    assert_eq!(body["error"], "reload_failed");
    assert_eq!(body["rolled_back"], true);
    assert_eq!(
        env.disk("haproxy.cfg").unwrap(),
        cfg_before,
        "previous configuration restored"
    );
    assert_eq!(
        env.disk("maps/host.map").unwrap(),
        "",
        "previous map restored"
    );
    assert_old_worker_serves(&env, pid);
    let state = env.state();
    assert_eq!(state["bundle"], v1.hash().as_str());
    assert!(state["haproxy"]["failed_reloads"].as_u64().unwrap() > 0);
    drop(blocker);

    // The next good bundle reloads normally.
    env.apply(&v2, "reload");
    assert_ne!(env.worker_pid(), pid);
    assert_eq!(http_get(&env.fe, "z.example").unwrap(), "b1");
}

#[test]
fn a_bundle_the_controller_checked_with_the_running_version_reloads_without_a_second_check() {
    let env = Env::start(Options::default());
    let (a1, b1) = (backend("a1"), backend("b1"));
    let servers = [format!("server SRV_1 127.0.0.1:{a1} enabled")];
    let v1 = bundle(config(&env, &servers, b1, ""), "");
    assert_eq!(env.apply(&v1, "reload")["checked_by"], "agent");
    let running = env.state()["haproxy"]["version"]
        .as_str()
        .expect("the running HAProxy's version")
        .to_string();

    // Checked by the controller with the version the master runs: no second check.
    let section = |name: &str| format!("backend {name}\n    server s 127.0.0.1:{b1}\n");
    let v2 = bundle(config(&env, &servers, b1, &section("be_c")), "");
    let (status, body) = env.put_with(&v2, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["result"], "reload");
    assert_eq!(body["checked_by"], "controller", "{body:#}");
    assert!(body["timings_ms"].get("validate").is_none(), "{body:#}");

    // Another version (or none) proves nothing here: the agent checks.
    let v3 = bundle(config(&env, &servers, b1, &section("be_d")), "");
    let (status, body) = env.put_with(&v3, "", &[(api::CHECKED_WITH, "1.8.0")]);
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["checked_by"], "agent", "{body:#}");
    assert!(body["timings_ms"].get("validate").is_some(), "{body:#}");
    let pid = env.worker_pid();
    let cfg_before = env.disk("haproxy.cfg").unwrap();

    // A claim that does not hold: the reload fails, the previous files come back and the old
    // worker keeps serving; pushed again, the same bundle is checked here and refused.
    let bad = bundle(
        config(
            &env,
            &servers,
            b1,
            "backend be_x\n    no_such_keyword here\n",
        ),
        "",
    );
    let (status, body) = env.put_with(&bad, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 502, "{body:#}");
    assert_eq!(body["error"], "reload_failed");
    assert_eq!(body["rolled_back"], true);
    assert_eq!(env.disk("haproxy.cfg").unwrap(), cfg_before);
    assert_old_worker_serves(&env, pid);
    let (status, body) = env.put_with(&bad, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 422, "{body:#}");
    assert_eq!(body["error"], "invalid_config");
    assert_eq!(env.worker_pid(), pid);

    // And the next good bundle goes ahead as before.
    let v4 = bundle(config(&env, &servers, b1, &section("be_e")), "");
    let (status, body) = env.put_with(&v4, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(
        (status, body["checked_by"].as_str()),
        (200, Some("controller")),
        "{body:#}"
    );
    assert_ne!(env.worker_pid(), pid);
}

#[test]
fn stale_files_are_deleted_even_when_a_kind_becomes_empty() {
    let env = Env::start(Options::default());
    let (a1, b1) = (backend("a1"), backend("b1"));
    let cfg = config(
        &env,
        &[format!("server SRV_1 127.0.0.1:{a1} enabled")],
        b1,
        "",
    );
    std::fs::create_dir_all(env.cfg_dir.join("general")).unwrap();
    std::fs::write(env.cfg_dir.join("general/not-ours.txt"), "keep").unwrap();
    let v1 = Bundle::new(
        cfg.clone(),
        vec![
            file(FileKind::Map, "maps/host.map", ""),
            file(FileKind::Map, "maps/old.map", "k v\n"),
            file(FileKind::General, "general/a.http", "a"),
            file(FileKind::General, "general/b.http", "b"),
        ],
    );
    env.apply(&v1, "reload");
    assert_eq!(env.disk("general/a.http").as_deref(), Some("a"));

    // No general files at all any more, one map fewer: unreferenced files, so no reload.
    let v2 = bundle(cfg, "");
    env.apply(&v2, "runtime");
    assert!(env.disk("general/a.http").is_none());
    assert!(env.disk("general/b.http").is_none());
    assert!(env.disk("maps/old.map").is_none());
    assert_eq!(
        env.disk("general/not-ours.txt").as_deref(),
        Some("keep"),
        "files the agent did not write stay"
    );
    let state = env.state();
    assert_eq!(state["files"].as_object().unwrap().len(), 1, "{state:#}");
}

#[test]
fn refused_runtime_command_falls_back_to_a_reload_with_the_new_files() {
    let env = Env::start(Options::default());
    let (a1, b1) = (backend("a1"), backend("b1"));
    // static-rr only accepts weights 0% and 100% at runtime, so `set server … weight 20` fails.
    let cfg = |w: u32| {
        config(
            &env,
            &[format!("server SRV_1 127.0.0.1:{a1} enabled weight {w}")],
            b1,
            "",
        )
        .replace("balance roundrobin", "balance static-rr")
    };
    env.apply(&bundle(cfg(10), ""), "reload");
    let pid = env.worker_pid();
    let reply = env.apply(&bundle(cfg(20), ""), "reload");
    assert_eq!(
        reply["commands"],
        serde_json::json!(["set server be_a/SRV_1 weight 20"])
    );
    assert!(
        reply["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "runtime_failed"),
        "{reply:#}"
    );
    assert!(
        reply["warnings"][0].as_str().unwrap().contains("static"),
        "{reply:#}"
    );
    assert_ne!(env.worker_pid(), pid, "converged by reloading");
    assert!(env.runtime("get weight be_a/SRV_1").starts_with("20 "));
    assert_eq!(http_get(&env.fe, "a.example").unwrap(), "a1");
}

/// A `global` line loading a Lua file that keeps HAProxy reading its configuration for `secs`
/// seconds of CPU time (Lua runs as the configuration is read: by the master on 2.6, by the new
/// worker on 3.1 and later).
fn slow_lua(env: &Env, secs: u32) -> String {
    let path = env.root.join("slow.lua");
    std::fs::write(
        &path,
        format!("local t = os.clock()\nwhile os.clock() - t < {secs} do end\n"),
    )
    .unwrap();
    format!("    lua-load {}\n", path.display())
}

fn with_global(cfg: String, line: &str) -> String {
    cfg.replacen("global\n", &format!("global\n{line}"), 1)
}

fn running_version(env: &Env) -> String {
    env.state()["haproxy"]["version"]
        .as_str()
        .expect("the running HAProxy's version")
        .to_string()
}

/// Pushes `bundle` until the agent takes it (it answers 503 while HAProxy still loads a
/// reload it waits for), and returns the answer.
fn apply_when_loaded(env: &Env, bundle: &Bundle) -> Value {
    wait_for(
        "the agent to take the bundle",
        Duration::from_secs(30),
        || {
            let (status, body) = env.put(bundle);
            match status {
                200 => Some(body),
                503 => None,
                _ => panic!("{status}: {body:#}"),
            }
        },
    )
}

#[test]
fn a_reload_slower_than_the_timeout_keeps_its_files_and_is_confirmed_later() {
    let env = Env::start(Options {
        agent_args: vec!["--reload-timeout-secs".into(), "1".into()],
        ..Options::default()
    });
    let (a1, b1) = (backend("a1"), backend("b1"));
    let servers = [format!("server SRV_1 127.0.0.1:{a1} enabled")];
    let v1 = bundle(config(&env, &servers, b1, ""), "");
    env.apply(&v1, "reload");
    let pid = env.worker_pid();

    // v2 takes HAProxy 6 s to load, past the agent's 1 s. Restoring v1's files under it
    // would have it load v2's configuration with v1's map.
    let slow = with_global(config(&env, &servers, b1, ""), &slow_lua(&env, 6));
    let v2 = bundle(slow.clone(), "a.example be_b\n");
    let running = running_version(&env);
    let (status, body) = env.put_with(&v2, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 504, "{body:#}");
    assert_eq!(body["error"], "reload_unconfirmed");
    assert_eq!(body["rolled_back"], false);
    // Nor does another bundle change files under the loading HAProxy: 503 (2.6's master does
    // not answer while it loads; 3.1 and later list the new worker before it answers).
    let v3 = bundle(slow, "a.example be_a\n");
    let (status, body) = env.put_with(&v3, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 503, "{body:#}");
    assert_eq!(
        env.disk("maps/host.map").unwrap(),
        "a.example be_b\n",
        "the files HAProxy may be reading stay"
    );
    assert!(env.disk("haproxy.cfg").unwrap().contains("lua-load"));

    // HAProxy finishes loading v2, all of it.
    wait_for(
        "the new worker to serve v2",
        Duration::from_secs(30),
        || (http_get(&env.fe, "a.example").ok()? == "b1").then_some(()),
    );
    assert_ne!(env.worker_pid(), pid);
    let state = env.state();
    assert_eq!(state["mode"], "bootstrap", "{state:#}");
    assert_eq!(state["pending_reload"], v2.hash().as_str(), "{state:#}");
    assert_eq!(
        probe(&env.ip, env.probe_port, "/readyz").unwrap().0,
        200,
        "HAProxy serves checked bundles, not the bootstrap configuration: the pod stays ready"
    );
    // Pushed again, v2 is found loaded: no second (slow) reload.
    assert_eq!(apply_when_loaded(&env, &v2)["result"], "no_change");
    let state = env.state();
    assert_eq!(state["mode"], "applied", "{state:#}");
    assert_eq!(state["bundle"], v2.hash().as_str());
    assert!(state.get("pending_reload").is_none(), "{state:#}");
}

#[test]
fn a_first_reload_haproxy_refuses_after_the_timeout_is_not_taken_for_applied() {
    let env = Env::start(Options {
        agent_args: vec!["--reload-timeout-secs".into(), "1".into()],
        ..Options::default()
    });
    let (a1, b1) = (backend("a1"), backend("b1"));
    let servers = [format!("server SRV_1 127.0.0.1:{a1} enabled")];
    let pid = env.worker_pid();

    // The pod's first bundle, slow to load and then refused: a port someone else holds only
    // fails when bound.
    let blocker = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = blocker.local_addr().unwrap().port();
    let extra = format!("frontend fe_taken\n    bind 127.0.0.1:{taken}\n");
    let v2 = bundle(
        with_global(config(&env, &servers, b1, &extra), &slow_lua(&env, 3)),
        "a.example be_b\n",
    );
    let running = running_version(&env);
    let (status, body) = env.put_with(&v2, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 504, "{body:#}");
    assert_eq!(
        probe(&env.ip, env.probe_port, "/readyz").unwrap().0,
        503,
        "HAProxy serves the bootstrap configuration (or v2, not yet known): not ready"
    );
    wait_for(
        "HAProxy to report the failed reload",
        Duration::from_secs(30),
        || {
            let failed = env.state()["haproxy"]["failed_reloads"].as_u64()?;
            (failed > 0).then_some(())
        },
    );
    assert_eq!(env.worker_pid(), pid, "the bootstrap worker keeps serving");
    assert_eq!(http_get(&env.fe, "a.example").unwrap(), "bootstrap");
    assert_eq!(probe(&env.ip, env.probe_port, "/readyz").unwrap().0, 503);

    // With the port free, v2 pushed again is reloaded (slowly again), not taken for loaded.
    drop(blocker);
    let (status, body) = env.put_with(&v2, "", &[(api::CHECKED_WITH, &running)]);
    assert_eq!(status, 504, "{body:#}");
    wait_for(
        "the new worker to serve v2",
        Duration::from_secs(30),
        || (http_get(&env.fe, "a.example").ok()? == "b1").then_some(()),
    );
    assert_eq!(apply_when_loaded(&env, &v2)["result"], "no_change");
    assert_eq!(env.state()["bundle"], v2.hash().as_str());
    assert_eq!(probe(&env.ip, env.probe_port, "/readyz").unwrap().0, 200);
}

#[test]
fn runtime_commands_of_a_bundle_whose_fallback_reload_failed_are_undone_by_the_next_apply() {
    let env = Env::start(Options::default());
    let (a1, a2, b1) = (backend("a1"), backend("a2"), backend("b1"));
    // A Lua file outside the bundle that every reload loads (as a file on a mounted volume).
    let lua = env.root.join("ext.lua");
    std::fs::write(&lua, "-- fine\n").unwrap();
    let lua_line = format!("    lua-load {}\n", lua.display());
    // static-rr refuses runtime weights other than 0% and 100%.
    let cfg = |srv1: u16, w2: u32| {
        with_global(
            config(
                &env,
                &[
                    format!("server SRV_1 127.0.0.1:{srv1} enabled"),
                    format!("server SRV_2 127.0.0.1:{a1} enabled weight {w2}"),
                ],
                b1,
                "",
            )
            .replace("balance roundrobin", "balance static-rr"),
            &lua_line,
        )
    };
    let v1 = bundle(cfg(a1, 10), "");
    env.apply(&v1, "reload");
    let pid = env.worker_pid();

    // v2 moves SRV_1 (taken at runtime) and reweighs SRV_2 (refused); the reload it falls
    // back to fails too, as the Lua file broke in the meantime.
    std::fs::write(&lua, "error('broken')\n").unwrap();
    let (status, body) = env.put(&bundle(cfg(a2, 20), ""));
    assert_eq!(status, 502, "{body:#}");
    assert_eq!(body["error"], "reload_failed");
    assert_eq!(env.worker_pid(), pid, "the old worker keeps serving");
    assert!(
        env.runtime("show servers state be_a")
            .contains(&a2.to_string()),
        "SRV_1 was moved at runtime before the refusal"
    );
    let state = env.state();
    assert_eq!(
        state["mode"], "bootstrap",
        "the worker runs neither bundle: {state:#}"
    );
    assert_eq!(probe(&env.ip, env.probe_port, "/readyz").unwrap().0, 200);

    // v1 again, with the Lua file fixed: a reload, and only v1's servers serve.
    std::fs::write(&lua, "-- fine\n").unwrap();
    env.apply(&v1, "reload");
    for _ in 0..4 {
        assert_eq!(http_get(&env.fe, "a.example").unwrap(), "a1");
    }
}
