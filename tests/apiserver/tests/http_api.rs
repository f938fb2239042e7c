//! The dev API server over raw HTTP: pagination, watch ordering and resumption, 410 after
//! compaction, bookmarks, timeouts, selectors on lists and watches, status subresource and
//! generation, optimistic concurrency, fault injection, authentication and token rotation,
//! client certificates, CRD discovery and seeding with `--load`.

mod common;

use std::time::Duration;

use common::{agent_for, configmap, names, temp_dir, wait_for, EventStream, Server};
use serde_json::{json, Value};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("resourceVersion")
}

#[test]
fn list_pagination_returns_every_object_once() {
    let server = Server::start(&[]);
    for i in 0..25 {
        let (code, _) = server.call(
            "POST",
            CMS,
            Some(&configmap(&format!("cm-{i:02}"), json!({}))),
        );
        assert_eq!(code, 201);
    }
    let (_, first) = server.call("GET", &format!("{CMS}?limit=10"), None);
    assert_eq!(first["kind"], "ConfigMapList");
    assert_eq!(first["metadata"]["remainingItemCount"], 15);
    let list_rv = first["metadata"]["resourceVersion"].clone();
    // A change between pages does not show up in later pages: they are served at the first
    // page's version, as with etcd.
    server.call("POST", CMS, Some(&configmap("cm-99", json!({}))));
    let mut all = names(&first);
    let mut token = first["metadata"]["continue"].as_str().map(str::to_string);
    while let Some(t) = token {
        let (code, page) = server.call("GET", &format!("{CMS}?limit=10&continue={t}"), None);
        assert_eq!(code, 200);
        assert_eq!(page["metadata"]["resourceVersion"], list_rv);
        all.extend(names(&page));
        token = page["metadata"]["continue"].as_str().map(str::to_string);
    }
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(all, expected);

    // A continue token older than the compaction point answers 410 Expired.
    let (_, page) = server.call("GET", &format!("{CMS}?limit=5"), None);
    let t = page["metadata"]["continue"].as_str().unwrap().to_string();
    server.call(
        "POST",
        CMS,
        Some(&configmap("before-compaction", json!({}))),
    );
    server.call("POST", "/_dev/faults", Some(&json!({"compact": true})));
    let (code, status) = server.call("GET", &format!("{CMS}?limit=5&continue={t}"), None);
    assert_eq!(code, 410);
    assert_eq!(status["reason"], "Expired");
}

#[test]
fn watch_delivers_adds_updates_deletes_in_order_and_resumes() {
    let server = Server::start(&[]);
    let (_, list) = server.call("GET", CMS, None);
    let start = rv_of(&list);
    let watch = server.stream(&format!("{CMS}?watch=1&resourceVersion={start}"));
    assert_eq!(watch.status, 200);
    let (_, created) = server.call("POST", CMS, Some(&configmap("a", json!({}))));
    let mut updated = created.clone();
    updated["data"] = json!({"k": "v2"});
    let (code, updated) = server.call("PUT", &format!("{CMS}/a"), Some(&updated));
    assert_eq!(code, 200);
    let (code, _) = server.call("DELETE", &format!("{CMS}/a"), None);
    assert_eq!(code, 200);
    let mut last = start;
    for (kind, data) in [("ADDED", "v"), ("MODIFIED", "v2"), ("DELETED", "v2")] {
        let e = watch.next_change().expect("event");
        assert_eq!(e["type"], kind);
        assert_eq!(e["object"]["metadata"]["name"], "a");
        assert_eq!(e["object"]["data"]["k"], data);
        let rv = rv_of(&e["object"]);
        assert!(rv > last, "resourceVersions increase");
        last = rv;
    }
    assert_eq!(rv_of(&updated) + 1, last);

    // Resuming from a version replays exactly what followed it.
    let resumed = server.stream(&format!(
        "{CMS}?watch=1&resourceVersion={}",
        rv_of(&created)
    ));
    assert_eq!(resumed.next_change().unwrap()["type"], "MODIFIED");
    assert_eq!(resumed.next_change().unwrap()["type"], "DELETED");

    // resourceVersion=0 and unset start with the current state as ADDED events.
    server.call("POST", CMS, Some(&configmap("b", json!({}))));
    let fresh = server.stream(&format!("{CMS}?watch=true&resourceVersion=0"));
    let e = fresh.next_change().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("b"))
    );
}

#[test]
fn compaction_makes_old_versions_gone() {
    let server = Server::start(&["--history", "1000"]);
    let (_, a) = server.call("POST", CMS, Some(&configmap("a", json!({}))));
    let old = rv_of(&a);
    server.call("POST", CMS, Some(&configmap("b", json!({}))));
    let (_, out) = server.call("POST", "/_dev/faults", Some(&json!({"compact": true})));
    assert!(out["compactedResourceVersion"].is_string());
    let watch = server.stream(&format!("{CMS}?watch=1&resourceVersion={old}"));
    assert_eq!(watch.status, 200);
    let e = watch.next().expect("error event");
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["kind"], "Status");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert!(watch.next().is_none(), "the stream ends after the error");
    let (code, _) = server.call(
        "GET",
        &format!("{CMS}?resourceVersion={old}&resourceVersionMatch=Exact"),
        None,
    );
    assert_eq!(code, 410);
}

#[test]
fn bookmarks_and_timeout() {
    let server = Server::start(&[]);
    let (_, list) = server.call("GET", CMS, None);
    let watch = server.stream(&format!(
        "{CMS}?watch=1&allowWatchBookmarks=true&resourceVersion={}",
        rv_of(&list)
    ));
    let (_, created) = server.call("POST", CMS, Some(&configmap("x", json!({}))));
    assert_eq!(watch.next().unwrap()["type"], "ADDED");
    let b = watch.next().expect("bookmark");
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(b["object"]["kind"], "ConfigMap");
    assert!(rv_of(&b["object"]) >= rv_of(&created));

    let timed = server.stream(&format!(
        "{CMS}?watch=1&timeoutSeconds=1&resourceVersion={}",
        rv_of(&created)
    ));
    assert!(
        timed.next().is_none(),
        "the server ends the watch after timeoutSeconds"
    );
    let none = server.stream(&format!(
        "{CMS}?watch=1&resourceVersion={}",
        rv_of(&created)
    ));
    assert!(
        none.no_change_within(Duration::from_millis(700)),
        "no bookmarks unless asked for"
    );
}

#[test]
fn selectors_filter_lists_and_watches() {
    let server = Server::start(&[]);
    server.call(
        "POST",
        CMS,
        Some(&configmap("web", json!({"app": "web", "tier": "front"}))),
    );
    server.call("POST", CMS, Some(&configmap("db", json!({"app": "db"}))));
    server.call("POST", CMS, Some(&configmap("bare", json!({}))));
    let list = |q: &str| names(&server.call("GET", &format!("{CMS}?{q}"), None).1);
    assert_eq!(list("labelSelector=app%3Dweb"), ["web"]);
    assert_eq!(list("labelSelector=app%3D%3Dweb"), ["web"]);
    assert_eq!(list("labelSelector=app!%3Dweb"), ["bare", "db"]);
    assert_eq!(list("labelSelector=app%20in%20(web,db)"), ["db", "web"]);
    assert_eq!(list("labelSelector=app%20notin%20(web)"), ["bare", "db"]);
    assert_eq!(list("labelSelector=tier"), ["web"]);
    assert_eq!(list("labelSelector=!app"), ["bare"]);
    assert_eq!(list("fieldSelector=metadata.name%3Ddb"), ["db"]);
    assert_eq!(
        list("fieldSelector=metadata.namespace!%3Ddefault"),
        Vec::<String>::new()
    );
    let (code, status) = server.call("GET", &format!("{CMS}?fieldSelector=spec.x%3D1"), None);
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));

    // An object leaving the selector arrives as DELETED, one entering it as ADDED.
    let (_, l) = server.call("GET", CMS, None);
    let watch = server.stream(&format!(
        "{CMS}?watch=1&labelSelector=app%3Dweb&resourceVersion={}",
        rv_of(&l)
    ));
    let patch = |name: &str, body: Value| {
        server.call_as(
            "PATCH",
            &format!("{CMS}/{name}"),
            Some(&body),
            Some(&server.token),
            "application/merge-patch+json",
        )
    };
    assert_eq!(
        patch("web", json!({"metadata": {"labels": {"app": "old"}}})).0,
        200
    );
    assert_eq!(
        patch("db", json!({"metadata": {"labels": {"app": "web"}}})).0,
        200
    );
    let e = watch.next_change().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("DELETED"), Some("web"))
    );
    let e = watch.next_change().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("db"))
    );
}

#[test]
fn status_subresource_generation_and_conflicts() {
    let server = Server::start(&[]);
    let ing = "/apis/networking.k8s.io/v1/namespaces/default/ingresses";
    let body = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "web"}, "spec": {"ingressClassName": "haproxy"},
        "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
    let (code, created) = server.call("POST", ing, Some(&body));
    assert_eq!(code, 201);
    assert!(
        created["status"].is_null(),
        "status is not set through create"
    );
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(created["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| u.len() == 36));
    assert!(created["metadata"]["creationTimestamp"].is_string());
    let (code, dup) = server.call("POST", ing, Some(&body));
    assert_eq!((code, dup["reason"].as_str()), (409, Some("AlreadyExists")));
    assert_eq!(
        dup["message"],
        "ingresses.networking.k8s.io \"web\" already exists"
    );

    // Status through /status only; the main resource ignores status changes.
    let mut with_status = created.clone();
    with_status["status"] = json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.2"}]}});
    let (code, after_status) = server.call("PUT", &format!("{ing}/web/status"), Some(&with_status));
    assert_eq!(code, 200);
    assert_eq!(
        after_status["status"]["loadBalancer"]["ingress"][0]["ip"],
        "10.0.0.2"
    );
    assert_eq!(after_status["metadata"]["generation"], 1);
    let mut main = after_status.clone();
    main["status"] = json!({});
    main["spec"]["ingressClassName"] = json!("other");
    let (code, after_spec) = server.call("PUT", &format!("{ing}/web"), Some(&main));
    assert_eq!(code, 200);
    assert_eq!(
        after_spec["status"]["loadBalancer"]["ingress"][0]["ip"],
        "10.0.0.2"
    );
    assert_eq!(after_spec["metadata"]["generation"], 2);

    // A stale resourceVersion conflicts.
    let (code, conflict) = server.call("PUT", &format!("{ing}/web"), Some(&main));
    assert_eq!((code, conflict["reason"].as_str()), (409, Some("Conflict")));
    assert!(conflict["message"]
        .as_str()
        .unwrap()
        .contains("the object has been modified"));
    let (code, missing) = server.call("GET", &format!("{ing}/nope"), None);
    assert_eq!((code, missing["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(
        missing["message"],
        "ingresses.networking.k8s.io \"nope\" not found"
    );

    // Finalizers hold deletion until they are removed.
    let cm = json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}});
    server.call("POST", CMS, Some(&cm));
    let (_, deleting) = server.call("DELETE", &format!("{CMS}/held"), None);
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(server.call("GET", &format!("{CMS}/held"), None).0, 200);
    let (code, _) = server.call_as(
        "PATCH",
        &format!("{CMS}/held"),
        Some(&json!({"metadata": {"finalizers": null}})),
        Some(&server.token),
        "application/merge-patch+json",
    );
    assert_eq!(code, 200);
    assert_eq!(server.call("GET", &format!("{CMS}/held"), None).0, 404);
}

#[test]
fn faults_fail_delay_close_and_pause() {
    let server = Server::start(&[]);
    let (code, _) = server.call("POST", "/_dev/faults", Some(&json!({
        "failNext": {"count": 2, "code": 503, "pathPrefix": "/api/v1/namespaces/default/configmaps"}})));
    assert_eq!(code, 200);
    assert_eq!(
        server.call("GET", "/api/v1/namespaces", None).0,
        200,
        "other paths are not affected"
    );
    let (code, status) = server.call("GET", CMS, None);
    assert_eq!(
        (code, status["reason"].as_str(), status["kind"].as_str()),
        (503, Some("ServiceUnavailable"), Some("Status"))
    );
    assert_eq!(server.call("GET", CMS, None).0, 503);
    assert_eq!(server.call("GET", CMS, None).0, 200);

    let (code, body) = server.call("POST", "/_dev/faults", Some(&json!({"bogus": true})));
    assert_eq!(code, 400, "{body}");

    // Closing watches ends their streams.
    let watch = server.stream(&format!("{CMS}?watch=1"));
    wait_for("watch registered", || {
        (server.call("GET", "/_dev/state", None).1["watches"].as_u64() >= Some(1)).then_some(())
    });
    let (_, out) = server.call("POST", "/_dev/faults", Some(&json!({"closeWatches": true})));
    assert!(out["closedWatches"].as_u64() >= Some(1));
    assert!(watch.next().is_none());
    let watch = server.stream(&format!("{CMS}?watch=1"));
    wait_for("second watch registered", || {
        (server.call("GET", "/_dev/state", None).1["watches"].as_u64() >= Some(1)).then_some(())
    });
    let (_, out) = server.call(
        "POST",
        "/_dev/faults",
        Some(&json!({"closeWatches": "abrupt"})),
    );
    assert!(out["closedWatches"].as_u64() >= Some(1));
    assert!(watch.next().is_none(), "an abruptly closed stream ends too");

    // Paused types hold events back until resumed; nothing is lost.
    let (_, l) = server.call("GET", CMS, None);
    let watch = server.stream(&format!("{CMS}?watch=1&resourceVersion={}", rv_of(&l)));
    server.call(
        "POST",
        "/_dev/faults",
        Some(&json!({"pause": ["configmaps"]})),
    );
    server.call("POST", CMS, Some(&configmap("held-back", json!({}))));
    assert!(watch.no_change_within(Duration::from_millis(300)));
    server.call(
        "POST",
        "/_dev/faults",
        Some(&json!({"resume": ["configmaps"]})),
    );
    assert_eq!(
        watch.next_change().unwrap()["object"]["metadata"]["name"],
        "held-back"
    );

    // Latency applies to API requests until reset.
    server.call("POST", "/_dev/faults", Some(&json!({"latencyMs": 300})));
    let t = std::time::Instant::now();
    server.call("GET", CMS, None);
    assert!(t.elapsed() >= Duration::from_millis(300));
    server.call("DELETE", "/_dev/faults", None);
    assert_eq!(server.call("GET", "/_dev/faults", None).1["latencyMs"], 0);
}

#[test]
fn authentication_tokens_rotation_and_client_certificates() {
    let dir = temp_dir("tok");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "first-token\n").unwrap();
    let server = Server::start(&["--token-file", token_file.to_str().unwrap()]);
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig).unwrap();
    assert!(
        kubeconfig.contains("tokenFile:") && kubeconfig.contains("certificate-authority-data:")
    );
    let get = |token: Option<&str>| {
        server.call_as("GET", "/api/v1/namespaces", None, token, "application/json")
    };
    let (code, status) = get(None);
    assert_eq!(
        (code, status["reason"].as_str()),
        (401, Some("Unauthorized"))
    );
    assert_eq!(get(Some("first-token")).0, 200);
    assert_eq!(get(Some("wrong")).0, 401);
    assert_eq!(
        server
            .call_as("GET", "/version", None, None, "application/json")
            .0,
        200
    );

    // Rotation through the file: the old token stops working, the new one works.
    std::fs::write(&token_file, "second-token-longer\n").unwrap();
    wait_for("token file re-read", || {
        (get(Some("second-token-longer")).0 == 200).then_some(())
    });
    assert_eq!(get(Some("first-token")).0, 401);
    // And through the control endpoint.
    server.call_as(
        "POST",
        "/_dev/tokens",
        Some(&json!({"add": ["third"]})),
        None,
        "application/json",
    );
    assert_eq!(get(Some("third")).0, 200);

    // A client certificate signed by the server's CA authenticates without a token.
    let cert = std::fs::read(server.dir.join("client.crt")).unwrap();
    let key = std::fs::read(server.dir.join("client.key")).unwrap();
    let agent = agent_for(&server.dir, true, Some((&cert, &key)));
    let mut resp = agent
        .get(format!("{}/api/v1/namespaces", server.url))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp
        .body_mut()
        .read_to_string()
        .unwrap()
        .contains("NamespaceList"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plain_http_load_dir_and_crd_discovery() {
    let seed = temp_dir("seed");
    std::fs::write(seed.join("a.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: seeded, namespace: team}\ndata: {a: b}\n---\napiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g1}\nspec: {x: 1}\n").unwrap();
    std::fs::write(seed.join("crd.json"), json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster", "names": {"plural": "gadgets", "kind": "Gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}},
                          {"name": "v1beta1", "served": true, "storage": false}]}}).to_string()).unwrap();
    let server = Server::start_with(&["--load", seed.to_str().unwrap()], false);
    assert!(server.url.starts_with("http://"));
    assert_eq!(
        server
            .call("GET", "/api/v1/namespaces/team/configmaps/seeded", None)
            .0,
        200
    );
    let (_, gadget) = server.call("GET", "/apis/example.com/v1/gadgets/g1", None);
    assert_eq!(gadget["spec"]["x"], 1);
    let (_, old_version) = server.call("GET", "/apis/example.com/v1beta1/gadgets/g1", None);
    assert_eq!(old_version["apiVersion"], "example.com/v1beta1");

    let (_, groups) = server.call("GET", "/apis", None);
    let group = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "example.com")
        .cloned()
        .unwrap();
    assert_eq!(group["preferredVersion"]["version"], "v1");
    let (_, resources) = server.call("GET", "/apis/example.com/v1", None);
    let list = resources["resources"].as_array().unwrap();
    assert!(list
        .iter()
        .any(|r| r["name"] == "gadgets" && r["namespaced"] == false && r["kind"] == "Gadget"));
    assert!(list.iter().any(|r| r["name"] == "gadgets/status"));
    // Status subresource for the custom type; strategic merge patch is refused as in Kubernetes.
    let (code, _) = server.call_as(
        "PATCH",
        "/apis/example.com/v1/gadgets/g1/status",
        Some(&json!({"status": {"ready": true}})),
        Some(&server.token),
        "application/merge-patch+json",
    );
    assert_eq!(code, 200);
    let (code, _) = server.call_as(
        "PATCH",
        "/apis/example.com/v1/gadgets/g1",
        Some(&json!({"spec": {"x": 2}})),
        Some(&server.token),
        "application/strategic-merge-patch+json",
    );
    assert_eq!(code, 415);
    let _ = std::fs::remove_dir_all(seed);
    let _ = EventStream::open;
}
