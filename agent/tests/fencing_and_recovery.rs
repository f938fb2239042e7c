//! Who may apply (leader epoch, base hash, one at a time) and what happens when the agent or
//! HAProxy restarts at a bad moment.

mod support;

use std::time::Duration;

use haptic_agent::protocol::{Bundle, FileKind};
use support::*;

/// A small valid configuration; `variant` changes it structurally (a reload-class change).
fn bundle(env: &Env, variant: u32) -> Bundle {
    let cfg = format!(
        "{}frontend fe\n    bind {}\n    use_backend %[req.hdr(host),lower,map({}/maps/host.map,be_a)]\nbackend be_a\n    http-request return status 200 content-type text/plain string v{variant}\n",
        env.global(),
        env.fe,
        env.cfg_dir.display()
    );
    Bundle::new(
        cfg,
        vec![file(
            FileKind::Map,
            "maps/host.map",
            &format!("v{variant}.example be_a\n"),
        )],
    )
}

/// `bundle(env, variant)` that takes HAProxy `secs` seconds of CPU time to load: Lua runs as
/// the configuration is read (by the master on 2.6, by the new worker on 3.1 and later).
fn slow_bundle(env: &Env, variant: u32, secs: u32) -> Bundle {
    let lua = env.root.join("slow.lua");
    std::fs::write(
        &lua,
        format!("local t = os.clock()\nwhile os.clock() - t < {secs} do end\n"),
    )
    .unwrap();
    let b = bundle(env, variant);
    Bundle::new(
        b.haproxy_cfg.replacen(
            "global\n",
            &format!("global\n    lua-load {}\n", lua.display()),
            1,
        ),
        b.files,
    )
}

/// Waits until HAProxy serves `bundle(env, 2)` (a slow one loads for seconds).
fn wait_for_v2(env: &Env) {
    wait_for(
        "the new worker to serve v2",
        Duration::from_secs(30),
        || (http_get(&env.fe, "v2.example").ok()? == "v2").then_some(()),
    );
}

/// Restarts the agent with `fault` set and sends it `bundle`: the agent exits at that point of
/// the apply (status 86), as a crash would stop it.
fn crash_applying(env: &mut Env, fault: &str, bundle: &Bundle) {
    env.stop_agent();
    env.start_agent(&[("HAPTIC_AGENT_FAULT", fault)]);
    let body = serde_json::to_vec(&bundle.to_wire()).unwrap();
    assert!(
        env.client
            .put(&env.url("/v1/bundle"))
            .send(&body[..])
            .is_err(),
        "the agent dies mid-apply"
    );
    assert_eq!(
        env.agent
            .as_mut()
            .unwrap()
            .wait_exit(Duration::from_secs(10)),
        86
    );
    env.agent = None;
}

/// Runs the pod's init step (`haptic-agent init`) on the configuration directory `dir`, with
/// the environment's bootstrap configuration.
fn init_pod(env: &Env, dir: &std::path::Path) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_haptic-agent"))
        .arg("init")
        .arg("--bootstrap")
        .arg(env.cfg_dir.join("bootstrap.cfg"))
        .arg("--config-dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn stale_epoch_wrong_base_concurrent_and_repeated_puts() {
    let env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    let (status, body) = env.put_with(&v1, "", &[("X-Haptic-Epoch", "5"), ("If-Match", "*")]);
    assert_eq!(status, 200, "{body:#}");

    let v2 = bundle(&env, 2);
    let (status, body) = env.put_with(&v2, "", &[("X-Haptic-Epoch", "4")]);
    assert_eq!(status, 412, "{body:#}");
    assert_eq!(body["error"], "stale_epoch");
    assert_eq!(body["highest_epoch"], 5);

    let wrong = "0".repeat(64);
    let (status, body) = env.put_with(&v2, "", &[("X-Haptic-Epoch", "5"), ("If-Match", &wrong)]);
    assert_eq!(status, 409, "{body:#}");
    assert_eq!(body["current_bundle"], v1.hash().as_str());

    let (status, body) = env.put_with(&v2, "?dry_run=1", &[("If-Match", v1.hash().as_str())]);
    assert_eq!(
        (status, body["dry_run"].as_bool(), body["result"].as_str()),
        (200, Some(true), Some("reload")),
        "{body:#}"
    );
    assert_eq!(
        env.state()["bundle"],
        v1.hash().as_str(),
        "a dry run changes nothing"
    );

    let (status, body) = env.put_with(
        &v2,
        "",
        &[
            ("X-Haptic-Epoch", "6"),
            ("If-Match", &format!("\"{}\"", v1.hash())),
        ],
    );
    assert_eq!(status, 200, "{body:#}");
    // The same bundle again (say, a retry after a lost reply with the old base) is a no-op.
    let (status, body) = env.put_with(
        &v2,
        "",
        &[("X-Haptic-Epoch", "6"), ("If-Match", v1.hash().as_str())],
    );
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("no_change")),
        "{body:#}"
    );
    assert_eq!(env.state()["leader_epoch"], 6);

    // Concurrent PUTs: while one apply runs (state says busy), a second one gets 423.
    let mut variant = 3;
    let refused = loop {
        assert!(variant < 13, "never caught an apply in flight");
        let slow = bundle(&env, variant);
        let url_env = (
            env.client.clone(),
            env.url("/v1/bundle"),
            serde_json::to_vec(&slow.to_wire()).unwrap(),
        );
        let first = std::thread::spawn(move || {
            let (client, url, body) = url_env;
            client
                .put(&url)
                .send(&body[..])
                .map(|r| r.status().as_u16())
        });
        let caught = wait_for(
            "the first apply to finish or be seen busy",
            Duration::from_secs(30),
            || {
                if env.state()["busy"] == true {
                    Some(true)
                } else if first.is_finished() {
                    Some(false)
                } else {
                    None
                }
            },
        );
        let second = caught.then(|| env.put(&bundle(&env, variant + 100)));
        assert_eq!(first.join().unwrap().expect("first PUT"), 200);
        variant += 1;
        if let Some(r) = second {
            break r;
        }
    };
    assert_eq!(refused.0, 423, "{:#}", refused.1);
    assert_eq!(refused.1["error"], "busy");
}

#[test]
fn agent_killed_mid_apply_recovers_consistently() {
    let mut env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    env.apply(&v1, "reload");
    let pid = env.worker_pid();
    let cfg_v1 = env.disk("haproxy.cfg").unwrap();

    // Killed after staging and checking, before haproxy.cfg was replaced: rolled back at start.
    let mut v2 = bundle(&env, 2);
    v2.files
        .push(file(FileKind::General, "general/new.txt", "new\n"));
    let v2 = Bundle::new(v2.haproxy_cfg, v2.files);
    crash_applying(&mut env, "after-stage", &v2);
    assert!(
        env.disk("general/new.txt").is_some(),
        "the crash left a half-applied bundle behind"
    );
    env.start_agent(&[]);
    let state = env.state();
    assert_eq!(state["bundle"], v1.hash().as_str(), "{state:#}");
    assert_eq!(state["drift"]["config_ok"], true);
    assert_eq!(state["drift"]["files_ok"], true);
    assert_eq!(env.disk("haproxy.cfg").unwrap(), cfg_v1);
    assert_eq!(env.disk("maps/host.map").unwrap(), "v1.example be_a\n");
    assert!(env.disk("general/new.txt").is_none());
    assert!(!env.cfg_dir.join(".haptic/journal.json").exists());
    assert_eq!(env.worker_pid(), pid);

    // Killed after haproxy.cfg was replaced, before HAProxy was told: finished at start.
    crash_applying(&mut env, "after-commit", &v2);
    env.start_agent(&[]);
    let state = env.state();
    assert_eq!(state["bundle"], v2.hash().as_str(), "{state:#}");
    assert_eq!(state["last_apply"]["result"], "reload");
    assert_ne!(
        env.worker_pid(),
        pid,
        "the interrupted apply was finished with a reload"
    );
    assert_eq!(http_get(&env.fe, "x.example").unwrap(), "v2");
    assert_eq!(env.put(&v2).1["result"], "no_change");
}

#[test]
fn a_restart_while_haproxy_loads_the_interrupted_bundle_keeps_its_files() {
    let mut env = Env::start(Options {
        agent_args: vec!["--reload-timeout-secs".into(), "1".into()],
        ..Options::default()
    });
    let v1 = bundle(&env, 1);
    env.apply(&v1, "reload");
    let v2 = slow_bundle(&env, 2, 4);
    // Killed before HAProxy was told; the restarted agent's reload is not confirmed in time:
    // the committed files stay (restoring v1's under the loading HAProxy would mix the two).
    crash_applying(&mut env, "after-commit", &v2);
    env.start_agent(&[]);
    assert_eq!(env.disk("maps/host.map").unwrap(), "v2.example be_a\n");
    assert!(!env.cfg_dir.join(".haptic/journal.json").exists());
    wait_for_v2(&env);
    let state = env.state();
    assert_eq!(state["mode"], "bootstrap", "{state:#}");
    assert_eq!(state["pending_reload"], v2.hash().as_str(), "{state:#}");
    let answer = wait_for("the agent to take v2", Duration::from_secs(30), || {
        let (status, body) = env.put(&v2);
        (status == 200).then_some(body)
    });
    assert_eq!(answer["result"], "no_change", "{answer:#}");
}

#[test]
fn an_agent_killed_while_haproxy_loads_restarts_without_touching_the_files() {
    let mut env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    env.apply(&v1, "reload");
    let v2 = slow_bundle(&env, 2, 5);
    let running = env.state()["haproxy"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    // The agent waits for HAProxy to load v2 (5 s) and is killed meanwhile.
    let pushed = std::thread::spawn({
        let (client, url) = (env.client.clone(), env.url("/v1/bundle"));
        let body = serde_json::to_vec(&v2.to_wire()).unwrap();
        move || {
            client
                .put(&url)
                .header(haptic_agent::protocol::api::CHECKED_WITH, &running)
                .send(&body[..])
                .is_err()
        }
    });
    wait_for("HAProxy to load v2", Duration::from_secs(10), || {
        env.disk("maps/host.map")
            .filter(|m| m.starts_with("v2"))
            .map(|_| std::thread::sleep(Duration::from_millis(500)))
    });
    env.agent.as_mut().unwrap().child.kill().unwrap();
    env.stop_agent();
    assert!(pushed.join().unwrap(), "the agent died mid-apply");
    // Restarted while HAProxy still loads: finishing the apply cannot be confirmed (2.6's
    // master does not answer, 3.1 and later refuse a second reload), and rolling back would
    // put v1's files under the loading HAProxy.
    env.start_agent(&[]);
    assert_eq!(env.disk("maps/host.map").unwrap(), "v2.example be_a\n");
    wait_for_v2(&env);
    let state = env.state();
    assert_eq!(state["mode"], "bootstrap", "{state:#}");
    let answer = wait_for("the agent to take v2", Duration::from_secs(30), || {
        let (status, body) = env.put(&v2);
        (status == 200).then_some(body)
    });
    assert_eq!(env.state()["bundle"], v2.hash().as_str(), "{answer:#}");
    assert_eq!(http_get(&env.fe, "v2.example").unwrap(), "v2");
}

#[test]
fn haproxy_restarted_with_the_bootstrap_config_reports_bootstrap() {
    let mut env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    env.apply(&v1, "reload");
    assert_eq!(env.state()["mode"], "applied");

    // What the HAProxy container does on every start: copy the bootstrap config, start afresh.
    env.stop_haproxy();
    std::fs::copy(
        env.cfg_dir.join("bootstrap.cfg"),
        env.cfg_dir.join("haproxy.cfg"),
    )
    .unwrap();
    env.start_haproxy();
    let state = env.state();
    assert_eq!(state["mode"], "bootstrap", "{state:#}");
    assert!(state["bundle"].is_null());
    assert_eq!(probe(&env.ip, env.probe_port, "/readyz").unwrap().0, 503);
    assert_eq!(http_get(&env.fe, "x.example").unwrap(), "bootstrap");

    // A base other than `*` cannot match; a takeover push re-applies the bundle.
    let (status, _) = env.put_with(&v1, "", &[("If-Match", v1.hash().as_str())]);
    assert_eq!(status, 409);
    let (status, body) = env.put_with(&v1, "", &[("If-Match", "*")]);
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("reload")),
        "{body:#}"
    );
    assert_eq!(env.state()["mode"], "applied");
    assert_eq!(http_get(&env.fe, "x.example").unwrap(), "v1");
    assert_eq!(probe(&env.ip, env.probe_port, "/readyz").unwrap().0, 200);
}

/// A pod restarted while an apply ran (a node reboot with the journal committed): the init step
/// writes the bootstrap configuration, so the interrupted apply is discarded, not finished. The
/// agent reports bootstrap mode (the controller pushes in full), never the interrupted bundle
/// while HAProxy would run the bootstrap configuration.
#[test]
fn init_after_an_interrupted_apply_leaves_the_agent_in_bootstrap_mode() {
    let mut env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    env.apply(&v1, "reload");
    let mut v2 = bundle(&env, 2);
    v2.files
        .push(file(FileKind::General, "general/new.txt", "new\n"));
    let v2 = Bundle::new(v2.haproxy_cfg, v2.files);
    crash_applying(&mut env, "after-commit", &v2);
    assert!(env.cfg_dir.join(".haptic/journal.json").exists());
    init_pod(&env, &env.cfg_dir);
    assert!(!env.cfg_dir.join(".haptic/journal.json").exists());
    assert!(
        !env.cfg_dir.join(".haptic/prev").exists(),
        "no backups kept"
    );
    assert!(!env.cfg_dir.join("haproxy.cfg.next").exists());
    env.start_agent(&[]);
    let state = env.state();
    assert!(state["bundle"].is_null(), "{state:#}");
    assert_eq!(env.disk("haproxy.cfg").unwrap(), env.bootstrap_cfg());
    // The next push applies in full, and the interrupted apply's files are the bundle's again.
    env.apply(&v2, "reload");
    assert_eq!(env.state()["bundle"], v2.hash().as_str());
    assert_eq!(http_get(&env.fe, "x.example").unwrap(), "v2");
    assert_eq!(env.disk("general/new.txt").unwrap(), "new\n");
}

/// An interrupted apply is finished at start only while haproxy.cfg is the one it committed:
/// written over since, the agent knows neither bundle to be on disk and starts in bootstrap
/// mode, instead of reloading HAProxy with that file under the bundle's name.
#[test]
fn an_interrupted_apply_whose_config_was_overwritten_starts_in_bootstrap_mode() {
    let mut env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    env.apply(&v1, "reload");
    let cfg_v1 = env.disk("haproxy.cfg").unwrap();
    let v2 = bundle(&env, 2);
    crash_applying(&mut env, "after-commit", &v2);
    std::fs::write(env.cfg_dir.join("haproxy.cfg"), env.bootstrap_cfg()).unwrap();
    env.start_agent(&[]);
    let state = env.state();
    assert!(state["bundle"].is_null(), "{state:#}");
    assert_ne!(env.disk("haproxy.cfg").unwrap(), cfg_v1);
    assert!(!env.cfg_dir.join(".haptic/journal.json").exists());
    assert!(!env.cfg_dir.join(".haptic/prev").exists());
    env.apply(&v2, "reload");
    assert_eq!(env.state()["bundle"], v2.hash().as_str());
    assert_eq!(http_get(&env.fe, "x.example").unwrap(), "v2");
}

#[test]
fn init_writes_the_bootstrap_config_and_keeps_the_epoch() {
    let env = Env::start(Options::default());
    let v1 = bundle(&env, 1);
    let (status, _) = env.put_with(&v1, "", &[("X-Haptic-Epoch", "9")]);
    assert_eq!(status, 200);
    let dir = temp_dir("init");
    std::fs::create_dir_all(dir.join(".haptic")).unwrap();
    std::fs::copy(
        env.cfg_dir.join(".haptic/state.json"),
        dir.join(".haptic/state.json"),
    )
    .unwrap();
    init_pod(&env, &dir);
    assert_eq!(
        std::fs::read_to_string(dir.join("haproxy.cfg")).unwrap(),
        env.bootstrap_cfg()
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(".haptic/state.json")).unwrap()).unwrap();
    assert!(state["bundle"].is_null());
    assert_eq!(state["leader_epoch"], 9);
    let _ = std::fs::remove_dir_all(dir);
}
