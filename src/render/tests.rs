use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::config::ConfigDocument;
use crate::store::path::PathExpr;
use crate::store::Doc;

/// A spec with the given haproxy.cfg template, snippets and maps, watching `things`.
fn spec_with(template: &str, snippets: &[(&str, &str)], maps: &[(&str, &str)]) -> Spec {
    let snippets: serde_json::Map<_, _> = snippets
        .iter()
        .map(|(n, t)| (n.to_string(), json!({"template": t})))
        .collect();
    let maps: serde_json::Map<_, _> = maps
        .iter()
        .map(|(n, t)| (n.to_string(), json!({"template": t})))
        .collect();
    let doc = ConfigDocument {
        metadata: None,
        spec: json!({
            "podSelector": {"matchLabels": {"app": "haproxy"}},
            "watchedResources": {"things": {"apiVersion": "v1", "resources": "configmaps", "indexBy": ["metadata.namespace", "metadata.labels.group"]}},
            "templatingSettings": {"extraContext": {"http_port": 8080, "feature": {"on": true}}},
            "templateSnippets": snippets,
            "maps": maps,
            "haproxyConfig": {"template": template},
        }),
    };
    doc.valid_spec("test").unwrap()
}

fn doc(v: serde_json::Value) -> Arc<Doc> {
    Arc::new(Doc::from_value(&v).unwrap())
}

fn thing(ns: &str, name: &str, group: &str) -> Arc<Doc> {
    doc(
        json!({"metadata": {"namespace": ns, "name": name, "labels": {"group": group}}, "data": {"port": 80.0, "list": [1, 2, 3]}}),
    )
}

fn inputs(objects: &[Arc<Doc>]) -> RenderInputs {
    let mut store = Store::new(vec![
        PathExpr::parse("metadata.namespace").unwrap(),
        PathExpr::parse("metadata.labels.group").unwrap(),
    ]);
    for o in objects {
        store.upsert(o.clone()).unwrap();
    }
    let mut stores = BTreeMap::new();
    stores.insert("things".to_string(), Arc::new(store));
    RenderInputs {
        stores,
        extra_context: json!({"http_port": 8080, "feature": {"on": true}})
            .as_object()
            .unwrap()
            .clone(),
        ..Default::default()
    }
}

fn render(template: &str, objects: &[Arc<Doc>]) -> Result<String, RenderError> {
    let engine = Engine::new(&spec_with(template, &[], &[])).unwrap();
    engine
        .render(&inputs(objects))
        .map(|r| r.haproxy_cfg.to_string())
}

#[test]
fn store_methods_list_fetch_get() {
    let objects = [
        thing("b", "y", "g1"),
        thing("a", "x", "g1"),
        thing("a", "w", "g2"),
    ];
    let out = render(
        "{% for t in resources.things.list() %}{{ t.metadata.namespace }}/{{ t.metadata.name }} {% endfor %}\n\
         {% for t in resources.things.fetch('a') %}{{ t.metadata.name }} {% endfor %}\n\
         {{ resources.things.get('a', 'g2').metadata.name }} {{ resources.things.get('a') is none }}\n\
         {{ resources.things.get('a', 'g1').data.port }} {{ resources.things.get('a', 'g1').data.list | length }}",
        &objects,
    )
    .unwrap();
    assert_eq!(out, "a/w a/x b/y \nw x \nw True\n80 3\n");
}

#[test]
fn extra_context_is_top_level_and_nested() {
    assert_eq!(
        render(
            "{{ http_port + 1 }} {{ extraContext.http_port }} {{ feature.on }}",
            &[]
        )
        .unwrap(),
        "8081 8080 True\n"
    );
}

#[test]
fn snippets_glob_in_name_order() {
    let spec = spec_with(
        "{% for s in snippets('hook-*') %}{% include s %}{% endfor %}",
        &[("hook-200-b", "B"), ("hook-100-a", "A"), ("other", "X")],
        &[],
    );
    assert_eq!(
        Engine::new(&spec)
            .unwrap()
            .render(&inputs(&[]))
            .unwrap()
            .haproxy_cfg
            .as_str(),
        "AB\n"
    );
}

#[test]
fn shared_first_seen_and_files_span_the_render() {
    let spec = spec_with(
        "{% do shared.set('k', 'from-cfg') %}{{ first_seen('a', 1) }} {{ first_seen('a', 1) }} {{ files.register('cert', 'x.example.com.pem', 'PEM') }} {{ paths.get('h.map', 'map') }}",
        &[],
        &[("h.map", "{{ shared.get('k') }} {{ shared.has('nope') }} {{ first_seen('a', 1) }}")],
    );
    let out = Engine::new(&spec).unwrap().render(&inputs(&[])).unwrap();
    assert_eq!(
        out.haproxy_cfg.as_str(),
        "True False ssl/x_example_com.pem maps/h.map\n"
    );
    assert_eq!(out.files.len(), 2);
    let map = out.files.iter().find(|f| f.kind == FileKind::Map).unwrap();
    assert_eq!(
        (map.path.as_str(), map.content.as_str()),
        ("maps/h.map", "from-cfg False False\n")
    );
    let cert = out.files.iter().find(|f| f.kind == FileKind::Cert).unwrap();
    assert_eq!(
        (cert.path.as_str(), cert.content.as_str()),
        ("ssl/x_example_com.pem", "PEM")
    );
}

#[test]
fn conflicting_registrations_fail() {
    let err = render(
        "{{ files.register('map', 'a.map', 'one') }}{{ files.register('map', 'a.map', 'two') }}",
        &[],
    )
    .unwrap_err();
    assert!(err.message.contains("different content"), "{err}");
}

#[test]
fn filters() {
    let cases = [
        ("{{ dig(t, 'metadata', 'labels', 'group') }}|{{ dig(t, 'metadata', 'nope', 'x') is none }}", "g|True"),
        ("{{ none | fallback('d') }}|{{ '' | fallback('d') }}|{{ missing | fallback('d') }}|{{ false | fallback('d') }}", "d||d|False"),
        ("{{ 'aGVsbG8=' | b64decode }}|{{ 'hello' | b64encode }}", "hello|aGVsbG8="),
        ("{{ regex_search('abc123', '[0-9]+$') }}|{{ 'a.b.c' | regex_replace('\\\\.', '_') }}|{{ 'a.b' | regex_escape | safe }}", "True|a_b_c|a\\.b"),
        ("{{ '/x/y/z.pem' | basename }}|{{ 'abc' | sha256 }}", "z.pem|ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("{{ ['be-a', 'fe-b', 'be-c'] | glob_match('be-*') | join(',') }}", "be-a,be-c"),
        ("{{ {'a': [1, 'x']} | tojson }}", "{\"a\": [1, \"x\"]}"),
        ("{{ debug({'k': 1}, 'lbl') }}", "# DEBUG lbl:\n# {\n#   \"k\": 1\n# }"),
        ("{{ t.metadata.labels | has_prefixed_key('gr') }}|{{ t.metadata.labels is having_prefixed_key('x') }}|{{ none | has_prefixed_key('') }}", "True|False|False"),
    ];
    let t = thing("a", "x", "g");
    for (template, expected) in cases {
        let template = format!("{{% set t = resources.things.get('a', 'g') %}}{template}");
        assert_eq!(
            render(&template, std::slice::from_ref(&t)).unwrap(),
            format!("{expected}\n"),
            "{template}"
        );
    }
}

/// `annotated` keeps, in order, the objects with the annotation (a value that is true), with an
/// annotation key under a prefix, or (`or_field`) with a true field; stored objects and
/// template-built maps answer alike.
#[test]
fn annotated_selects_in_order() {
    let objects = [
        doc(json!({"metadata": {"namespace": "a", "labels": {"group": "g"}, "name": "plain"}})),
        doc(
            json!({"metadata": {"namespace": "b", "labels": {"group": "g"}, "name": "on", "annotations": {"x.io/on": "yes", "y.io/a": "1"}}}),
        ),
        doc(
            json!({"metadata": {"namespace": "c", "labels": {"group": "g"}, "name": "empty", "annotations": {"x.io/on": ""}}}),
        ),
        doc(
            json!({"metadata": {"namespace": "d", "labels": {"group": "g"}, "name": "tls", "annotations": "not a map"}, "spec": {"tls": [{"secretName": "s"}]}}),
        ),
        doc(
            json!({"metadata": {"namespace": "e", "labels": {"group": "g"}, "name": "notls", "annotations": {"x.io/other": "1"}}, "spec": {"tls": []}}),
        ),
    ];
    let names = "{% for o in list %}{{ o.metadata.name }} {% endfor %}";
    let template = format!(
        "{{% set all = resources.things.list() %}}\
         {{% set list = all | annotated('x.io/on') %}}{names}|\
         {{% set list = all | annotated(prefix='x.io/') %}}{names}|\
         {{% set list = all | annotated(prefix='y.io/', or_field='spec.tls') %}}{names}|\
         {{% set list = [{{'metadata': {{'name': 'm', 'annotations': {{'x.io/on': 'y'}}}}}}, {{'metadata': {{'name': 'n'}}}}, {{'metadata': {{'name': 't'}}, 'spec': {{'tls': [1]}}}}] %}}\
         {{% set list = list | annotated('x.io/on', or_field='spec.tls') %}}{names}|\
         {{{{ none | annotated('x.io/on') | length }}}}|\
         {{% set c = collector() %}}{{% for o in all %}}{{% do c.append(o) %}}{{% endfor %}}\
         {{% set list = c | annotated(prefix='x.io/', or_field='spec.tls') %}}{names}|\
         {{% set list = (all | list) + [{{'metadata': {{'name': 'm', 'annotations': {{'x.io/on': 'y'}}}}}}] %}}\
         {{% set list = list | annotated('x.io/on') %}}{names}|\
         {{% set c = collector() %}}{{% do c.append([1]) %}}{{{{ c | annotated('x.io/on') | length }}}}|\
         {{% set c = collector() %}}{{% for o in all %}}{{% do c.append(o) %}}{{% endfor %}}\
         {{% set list = c | annotated('x.io/on') %}}{names}|\
         {{% set list = c | annotated(prefix='x.io/') %}}{names}|\
         {{% set list = c | annotated('y.io/a') %}}{names}|\
         {{% do c.append(all[1]) %}}{{% set list = c | annotated('y.io/a') %}}{names}|\
         {{% set list = c | annotated(prefix='x.io/o') %}}{names}"
    );
    // Stored objects are tested in place (a list, a collector); a list with anything else
    // in it, such as a list, item by item (a collector cannot hold itself: see
    // `unit_outputs_as_arguments_and_self_holding_collectors_do_not_panic`).
    assert_eq!(
        render(&template, &objects).unwrap(),
        "on |on empty notls |on tls |m t |0|on empty tls notls |on m |0|on |on empty notls |on |on on |on empty notls on \n"
    );
    for bad in [
        "{{ [] | annotated }}",
        "{{ [] | annotated('a', prefix='b') }}",
        "{{ [] | annotated('a', other='b') }}",
    ] {
        assert!(render(bad, &[]).is_err(), "{bad}");
    }
}

/// A collector of stored objects answers `annotated` from the annotations it read once; it
/// must pick exactly what testing each object does, for every kind of annotation value an
/// object may hold (the API server only sends strings; a store holds what it is given), and
/// for annotations that are not a map.
#[test]
fn annotated_collector_picks_as_each_object_does() {
    let values = [
        json!("yes"),
        json!(""),
        json!(0),
        json!(1),
        json!(0.0),
        json!(true),
        json!(false),
        json!(null),
        json!([]),
        json!([0]),
        json!({}),
        json!({"a": 1}),
    ];
    let mut objects: Vec<Arc<Doc>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            doc(json!({"metadata": {"namespace": "n", "labels": {"group": "g"}, "name": format!("o{i}"),
                "annotations": {"x.io/on": v, "x.io/other": "1"}}}))
        })
        .collect();
    for (i, annotations) in [json!("x.io/on"), json!(["x.io/on"]), json!(null), json!({})]
        .into_iter()
        .enumerate()
    {
        objects.push(doc(
            json!({"metadata": {"namespace": "n", "labels": {"group": "g"},
            "name": format!("p{i}"), "annotations": annotations}}),
        ));
    }
    let names = "{% for o in list %}{{ o.metadata.name }} {% endfor %}";
    for select in [
        "annotated('x.io/on')",
        "annotated('x.io/other')",
        "annotated('x.io/none')",
        "annotated(prefix='x.io/')",
        "annotated(prefix='x.io/on')",
        "annotated(prefix='')",
        "annotated(prefix='y')",
    ] {
        let template = format!(
            "{{% set all = resources.things.list() %}}\
             {{% set c = collector() %}}{{% for o in all %}}{{% do c.append(o) %}}{{% endfor %}}\
             {{% set list = all | {select} %}}{names}|{{% set list = c | {select} %}}{names}"
        );
        let out = render(&template, &objects).unwrap();
        let (each, collected) = out.trim_end().split_once('|').unwrap();
        assert_eq!(each.trim_end(), collected, "{select}");
        assert!(
            select.contains("none") || select.contains("'y'") || !each.is_empty(),
            "{select}"
        );
    }
}

#[test]
fn sort_by_multi_key() {
    let out = render(
        "{% set items = [{'p': '/a', 'w': 1}, {'p': '/long/path', 'w': 1}, {'p': '/b', 'w': 5}, {'w': 3}] %}\
         {% for i in items | sort_by(['$.w:desc', '$.p | length:desc']) %}{{ i.p | fallback('-') }} {% endfor %}|\
         {% for i in items | sort_by('$.p') %}{{ i.p | fallback('-') }} {% endfor %}|\
         {% for i in items | sort_by(['$.p:exists']) %}{{ i.p | fallback('-') }} {% endfor %}",
        &[],
    )
    .unwrap();
    assert_eq!(
        out,
        "/b - /long/path /a |/a /b /long/path - |- /a /long/path /b \n"
    );
}

#[test]
fn bad_regex_is_a_render_error() {
    let err = render("{{ regex_search('x', '(') }}", &[]).unwrap_err();
    assert!(err.message.contains("invalid regular expression"), "{err}");
}

#[test]
fn fail_message_is_verbatim_and_located() {
    let err = render(
        "line one\n{{ fail('Ingress default/x: host \"a b\" is invalid') }}",
        &[],
    )
    .unwrap_err();
    assert_eq!(err.message, "Ingress default/x: host \"a b\" is invalid");
    assert!(err.from_fail);
    assert_eq!((err.template.as_str(), err.line), ("haproxy.cfg", Some(2)));
}

#[test]
fn errors_in_snippets_name_the_snippet_and_line() {
    let spec = spec_with(
        "a\n{% include 'snip' %}",
        &[("snip", "ok\n\n{{ 1 + 'x' }}")],
        &[],
    );
    let err = Engine::new(&spec)
        .unwrap()
        .render(&inputs(&[]))
        .unwrap_err();
    assert!(err.template.starts_with("snip"), "{err}");
    assert_eq!(err.line, Some(3));
    let spec = spec_with("{% if %}", &[], &[]);
    let err = Engine::new(&spec).unwrap_err();
    assert_eq!((err.template.as_str(), err.line), ("haproxy.cfg", Some(1)));
}

#[test]
fn fuel_stops_runaway_templates() {
    let spec = spec_with(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        &[],
        &[],
    );
    let err = Engine::with_fuel(&spec, 1_000_000)
        .unwrap()
        .render(&inputs(&[]))
        .unwrap_err();
    assert!(err.message.contains("evaluation budget"), "{err}");
}

#[test]
fn post_processing_normalises_lines_and_trailing_newline() {
    let steps = vec![RegexReplace::new("^[ ]+", "  ".into()).unwrap()];
    assert_eq!(
        post_process("global\n      daemon\n\tkeep\n\n\n", &steps),
        "global\n  daemon\n\tkeep\n"
    );
    assert_eq!(post_process("", &[]), "\n");
    assert_eq!(post_process("x", &[]), "x\n");
    let anchors = vec![RegexReplace::new("(\\w+)$", "<$1>".into()).unwrap()];
    assert_eq!(post_process("a b\nc d\n", &anchors), "a <b>\nc <d>\n");
}

/// The indentation normaliser done by hand gives what the regex gives, line for line.
#[test]
fn leading_space_normaliser_matches_the_regex() {
    let lines = [
        "",
        " ",
        "   ",
        "x",
        " x",
        "    x y  ",
        "\tx",
        " \tx",
        "\u{a0}x",
        "  é ",
        "x  ",
    ];
    for (pattern, replace) in [("^[ ]+", "  "), ("^ +", ""), ("^[ ]+", "    ")] {
        let fast = RegexReplace::new(pattern, replace.into()).unwrap();
        assert!(fast.leading_spaces, "{pattern}");
        let slow = RegexReplace {
            leading_spaces: false,
            ..fast.clone()
        };
        for line in lines {
            assert_eq!(
                fast.apply(line),
                slow.apply(line),
                "{pattern:?} on {line:?}"
            );
        }
    }
    // A replacement naming a group, or another pattern, keeps the regex.
    assert!(
        !RegexReplace::new("^( +)", "$1".into())
            .unwrap()
            .leading_spaces
    );
    assert!(
        !RegexReplace::new("^[ ]+", "$0".into())
            .unwrap()
            .leading_spaces
    );
}

#[test]
fn status_set_is_collected() {
    let spec = spec_with("{{ status.set('networking.k8s.io/v1', 'Ingress', 'ns', 'web', {'loadBalancer': {'ingress': [{'ip': '10.0.0.1'}]}}) }}ok", &[], &[]);
    let out = Engine::new(&spec).unwrap().render(&inputs(&[])).unwrap();
    assert_eq!(out.haproxy_cfg.as_str(), "ok\n");
    assert_eq!(out.statuses.len(), 1);
    assert_eq!(
        *out.statuses[0].status,
        json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}})
    );
}

#[test]
fn current_config_and_pods() {
    let spec = spec_with("{% for s in current_config.backends.be_x.servers %}{{ s.name }}={{ s.address }}:{{ s.port }} {% endfor %}{{ controller.haproxy_pods.list() | length }}", &[], &[]);
    let mut inp = inputs(&[]);
    inp.current_config = Some(Arc::new(current_config::CurrentConfig::parse(
        "backend be_x\n  server SRV_1 10.1.1.1:80\n",
    )));
    let mut pods = Store::new(pod_index());
    pods.upsert_value(&json!({"metadata": {"namespace": "n", "name": "p1"}}))
        .unwrap();
    inp.stores.insert(HAPROXY_PODS.into(), Arc::new(pods));
    assert_eq!(
        Engine::new(&spec)
            .unwrap()
            .render(&inp)
            .unwrap()
            .haproxy_cfg
            .as_str(),
        "SRV_1=10.1.1.1:80 1\n"
    );
}

#[test]
fn rendering_is_byte_identical_across_runs() {
    let objects: Vec<_> = (0..50)
        .map(|i| {
            thing(
                &format!("ns{}", i % 7),
                &format!("o{i}"),
                &format!("g{}", i % 3),
            )
        })
        .collect();
    let template = "{% for t in resources.things.list() %}{{ t.metadata.name }} {{ t | tojson }}\n{% endfor %}{% for k in extraContext %}{{ k }}{% endfor %}";
    let engine = Engine::new(&spec_with(template, &[], &[])).unwrap();
    let a = engine.render(&inputs(&objects)).unwrap();
    let b = engine.render(&inputs(&objects)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_bundle().hash(), b.to_bundle().hash());
}

/// Each thing is two units: one adds a route to `shared`, one writes a backend; a thing whose
/// `data.port` is not a number fails in its second unit.
fn unit_engine() -> Engine {
    Engine::new(&spec_with(
        "{% for t in resources.things.list() %}{{ unit('collect', owner=t, t=t) }}{% endfor %}\
         {% for t in resources.things.list() %}{{ unit('backend', owner=t, t=t) }}{% endfor %}\
         routes:{% for r in shared.get('routes', []) %} {{ r }}{% endfor %}\n",
        &[
            ("collect", "{% do shared.append('routes', t.metadata.name) %}"),
            (
                "backend",
                "\nbackend {{ t.metadata.name }} port {{ t.data.port | int_range(1, 65535, 'data.port') }}",
            ),
        ],
        &[],
    ))
    .unwrap()
}

#[test]
fn a_failing_unit_leaves_its_whole_owner_out_and_nothing_else() {
    let engine = unit_engine();
    let bad = doc(
        json!({"kind": "ConfigMap", "metadata": {"namespace": "a", "name": "bad", "labels": {"group": "g"}}, "data": {"port": "99999"}}),
    );
    let out = engine
        .render(&inputs(&[
            thing("a", "x", "g1"),
            bad,
            thing("b", "y", "g1"),
        ]))
        .unwrap();
    assert_eq!(
        out.haproxy_cfg.as_str(),
        "\nbackend x port 80\nbackend y port 80routes: x y\n"
    );
    assert_eq!(out.dropped.len(), 1);
    assert_eq!(
        out.dropped[0].to_string(),
        "ConfigMap a/bad: left out of the configuration: data.port: \"99999\" is above 65535"
            .replace(
                "\"99999\" is above 65535",
                &out.dropped[0].message["data.port: ".len()..]
            )
    );
    assert!(out.dropped[0].message.starts_with("data.port: "));
    // Its route, added by a unit that succeeded before the failing one, is gone too.
    assert!(!out.haproxy_cfg.contains("bad"));
}

#[test]
fn unchanged_units_replay_and_a_change_renders_only_its_units() {
    let engine = unit_engine();
    let mut cache = RenderCache::new();
    let objects = [
        thing("a", "x", "g1"),
        thing("b", "y", "g1"),
        thing("c", "z", "g2"),
    ];
    let first = engine.render_cached(&inputs(&objects), &mut cache).unwrap();
    assert_eq!((cache.stats.rendered, cache.stats.replayed), (6, 0));
    let again = engine.render_cached(&inputs(&objects), &mut cache).unwrap();
    assert_eq!((cache.stats.rendered, cache.stats.replayed), (0, 6));
    assert_eq!(first, again);
    let changed = doc(
        json!({"metadata": {"namespace": "b", "labels": {"group": "g"}, "name": "y", "labels": {"group": "g1"}}, "data": {"port": 8080}}),
    );
    let objects = [objects[0].clone(), changed, objects[2].clone()];
    let third = engine.render_cached(&inputs(&objects), &mut cache).unwrap();
    assert_eq!((cache.stats.rendered, cache.stats.replayed), (2, 4));
    assert_eq!(third, engine.render(&inputs(&objects)).unwrap());
    assert!(third.haproxy_cfg.contains("backend y port 8080"));
}

#[test]
fn collectors_grow_in_place() {
    assert_eq!(
        render(
            "{% set c = collector() %}{% for i in range(3) %}{% do c.append(i) %}{% endfor %}{{ c | length }} {{ c[1] }} {{ c | join(',') }}",
            &[]
        )
        .unwrap(),
        "3 1 0,1,2\n"
    );
}

/// Things with ports kept in a second store: the top level iterates things, units look up
/// their port, so a port change is seen by one unit only.
fn splice_engine(backend: &str, top: &str) -> Engine {
    let doc = ConfigDocument {
        metadata: None,
        spec: json!({
            "podSelector": {"matchLabels": {"app": "haproxy"}},
            "watchedResources": {
                "things": {"apiVersion": "v1", "resources": "configmaps", "indexBy": ["metadata.namespace", "metadata.labels.group"]},
                "ports": {"apiVersion": "v1", "resources": "secrets", "indexBy": ["metadata.namespace", "metadata.name"]},
            },
            "templateSnippets": {"backend": {"template": backend}},
            "haproxyConfig": {"template": top, "postProcessing": [{"type": "regex_replace", "params": {"pattern": "^[ ]+", "replace": "  "}}]},
        }),
    };
    Engine::new(&doc.valid_spec("test").unwrap()).unwrap()
}

const SPLICE_BACKEND: &str = "\nbackend {{ t.metadata.name }}\n    server s 127.0.0.1:{{ resources.ports.get(t.metadata.namespace, t.metadata.name).data.port | int_range(1, 65535, 'data.port') }}";
const SPLICE_TOP: &str = "global\n{% for t in resources.things.list() %}{{ unit('backend', owner=t, t=t) }}{% endfor %}\nfrontend f\n    bind :80\n";

struct Cluster {
    things: Arc<Store>,
    ports: Arc<Store>,
}

impl Cluster {
    fn new(names: &[&str]) -> Cluster {
        let mut things = Store::new(vec![
            PathExpr::parse("metadata.namespace").unwrap(),
            PathExpr::parse("metadata.labels.group").unwrap(),
        ]);
        let mut ports = Store::new(vec![
            PathExpr::parse("metadata.namespace").unwrap(),
            PathExpr::parse("metadata.name").unwrap(),
        ]);
        for (i, name) in names.iter().enumerate() {
            things.upsert(thing("a", name, &format!("g{i}"))).unwrap();
            ports.upsert(port(name, json!(8000 + i))).unwrap();
        }
        Cluster {
            things: Arc::new(things),
            ports: Arc::new(ports),
        }
    }

    fn set_port(&mut self, name: &str, value: serde_json::Value) {
        Arc::make_mut(&mut self.ports)
            .upsert(port(name, value))
            .unwrap();
    }

    fn inputs(&self) -> RenderInputs {
        let mut stores = BTreeMap::new();
        stores.insert("things".to_string(), self.things.clone());
        stores.insert("ports".to_string(), self.ports.clone());
        RenderInputs {
            stores,
            ..Default::default()
        }
    }
}

fn port(name: &str, value: serde_json::Value) -> Arc<Doc> {
    doc(
        json!({"metadata": {"namespace": "a", "labels": {"group": "g"}, "name": name}, "data": {"port": value}}),
    )
}

/// Renders incrementally and from scratch; both must be equal, unit spans included.
fn both(engine: &Engine, cluster: &Cluster, cache: &mut RenderCache) -> Rendered {
    let incremental = engine.render_cached(&cluster.inputs(), cache).unwrap();
    let mut full = engine.render(&cluster.inputs()).unwrap();
    let mut spans = (*incremental.units).clone();
    spans.sort_by(|a, b| (&a.output, a.first, &a.unit).cmp(&(&b.output, b.first, &b.unit)));
    Arc::make_mut(&mut full.units)
        .sort_by(|a, b| (&a.output, a.first, &a.unit).cmp(&(&b.output, b.first, &b.unit)));
    let strip = |s: &[UnitSpan]| {
        s.iter()
            .map(|u| (u.unit.clone(), u.first, u.last))
            .collect::<Vec<_>>()
    };
    assert_eq!(incremental.haproxy_cfg, full.haproxy_cfg);
    assert_eq!(strip(&spans), strip(&full.units));
    assert_eq!(incremental.dropped, full.dropped);
    incremental
}

#[test]
fn a_change_only_units_see_is_spliced_into_the_last_output() {
    let engine = splice_engine(SPLICE_BACKEND, SPLICE_TOP);
    let mut cluster = Cluster::new(&["x", "y", "z"]);
    let mut cache = RenderCache::new();
    both(&engine, &cluster, &mut cache);
    assert!(!cache.stats.spliced);
    // One port changes, to a value with more digits: the lines after it keep their numbers.
    cluster.set_port("y", json!(18001));
    let out = both(&engine, &cluster, &mut cache);
    assert!(cache.stats.spliced);
    assert_eq!((cache.stats.rendered, cache.stats.replayed), (1, 2));
    assert!(out
        .haproxy_cfg
        .contains("backend y\n  server s 127.0.0.1:18001\n"));
    let y = out
        .units
        .iter()
        .find(|u| u.unit.key() == "object a/y")
        .unwrap();
    assert!(y.fresh);
    assert_eq!(
        out.haproxy_cfg.lines().nth(y.last - 1),
        Some("  server s 127.0.0.1:18001")
    );
    // Nothing changed: spliced again, nothing rendered.
    both(&engine, &cluster, &mut cache);
    assert!(cache.stats.spliced);
    assert_eq!(cache.stats.rendered, 0);
}

#[test]
fn a_burst_of_changes_is_spliced_up_to_a_quarter_of_the_units() {
    let engine = splice_engine(SPLICE_BACKEND, SPLICE_TOP);
    let names: Vec<String> = (0..400).map(|i| format!("t{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut cluster = Cluster::new(&refs);
    let mut cache = RenderCache::new();
    both(&engine, &cluster, &mut cache);
    // 90 changes at once (more than the 64 always allowed, fewer than 400 / 4): spliced, and
    // equal to the full render, spans included (checked by `both`).
    for (i, name) in names.iter().enumerate().step_by(4).take(90) {
        cluster.set_port(name, json!(20000 + i));
    }
    let out = both(&engine, &cluster, &mut cache);
    assert!(cache.stats.spliced, "{:?}", cache.stats);
    assert_eq!((cache.stats.rendered, cache.stats.replayed), (90, 310));
    assert!(out
        .haproxy_cfg
        .contains("backend t356\n  server s 127.0.0.1:20356\n"));
    // 101 changes: past a quarter of the units, the full render (which replays the rest).
    for (i, name) in names.iter().enumerate().take(101) {
        cluster.set_port(name, json!(30000 + i));
    }
    both(&engine, &cluster, &mut cache);
    assert!(!cache.stats.spliced, "{:?}", cache.stats);
    assert_eq!(cache.stats.rendered, 101);
}

#[test]
fn a_unit_that_fails_or_acts_differently_takes_the_full_render() {
    // A port above 9000 also announces the thing in `shared`, which the top level prints.
    let backend = "{% set p = resources.ports.get(t.metadata.namespace, t.metadata.name).data.port | int_range(1, 65535, 'data.port') %}\
        {% if (p | int) > 9000 %}{% do shared.append('high', t.metadata.name) %}{% endif %}\nbackend {{ t.metadata.name }} port {{ p }}";
    let top = "{% for t in resources.things.list() %}{{ unit('backend', owner=t, t=t) }}{% endfor %}\nhigh:{% for h in shared.get('high', []) %} {{ h }}{% endfor %}\nend\n";
    let engine = splice_engine(backend, top);
    let mut cluster = Cluster::new(&["x", "y", "z"]);
    let mut cache = RenderCache::new();
    both(&engine, &cluster, &mut cache);
    cluster.set_port("y", json!(9500));
    let out = both(&engine, &cluster, &mut cache);
    assert!(
        !cache.stats.spliced,
        "the unit's effects changed: {:?} {}",
        cache.stats, out.haproxy_cfg
    );
    assert!(out.haproxy_cfg.contains("high: y\n"));
    cluster.set_port("z", json!(99999));
    let out = both(&engine, &cluster, &mut cache);
    assert!(!cache.stats.spliced, "the unit failed");
    assert_eq!(out.dropped.len(), 1);
    // With an object left out, a change another unit sees alone is still spliced.
    cluster.set_port("x", json!(8100));
    let out = both(&engine, &cluster, &mut cache);
    assert!(cache.stats.spliced);
    assert!(out.haproxy_cfg.contains("backend x port 8100"));
    // The left-out object fixed: it comes back (full render).
    cluster.set_port("z", json!(8002));
    let out = both(&engine, &cluster, &mut cache);
    assert!(!cache.stats.spliced);
    assert!(out.dropped.is_empty());
}

#[test]
fn a_top_level_that_inspects_unit_output_is_never_spliced() {
    let top = "{% for t in resources.things.list() %}{% set b = unit('backend', owner=t, t=t) %}{% if '18001' in (b | string) %}\n# big port{% endif %}{{ b }}{% endfor %}\nend\n";
    let engine = splice_engine(SPLICE_BACKEND, top);
    let mut cluster = Cluster::new(&["x", "y"]);
    let mut cache = RenderCache::new();
    both(&engine, &cluster, &mut cache);
    cluster.set_port("y", json!(18001));
    let out = both(&engine, &cluster, &mut cache);
    assert!(!cache.stats.spliced);
    assert!(out.haproxy_cfg.contains("# big port"));
}

#[test]
fn unit_output_through_a_macro_or_set_block_is_never_spliced() {
    for top in [
        "{% macro m(t) %}{{ unit('backend', owner=t, t=t) }}{% endmacro %}{% for t in resources.things.list() %}{{ m(t) }}{% endfor %}\nend\n",
        "{% for t in resources.things.list() %}{% set b %}{{ unit('backend', owner=t, t=t) }}{% endset %}{{ b }}{% endfor %}\nend\n",
    ] {
        let engine = splice_engine(SPLICE_BACKEND, top);
        let mut cluster = Cluster::new(&["x", "y"]);
        let mut cache = RenderCache::new();
        both(&engine, &cluster, &mut cache);
        cluster.set_port("y", json!(18001));
        let out = both(&engine, &cluster, &mut cache);
        assert!(!cache.stats.spliced, "{top}");
        assert!(out.haproxy_cfg.contains("127.0.0.1:18001"));
    }
}

/// Unit markers are removed and each unit's place is reported: its lines and its byte span in
/// the clean text, inner units before the ones around them; other private-use characters
/// (the markers' lead byte), and a stray id terminator, are plain text.
#[test]
fn strip_markers_reports_unit_spans() {
    use units::{MARK_END, MARK_ID_END, MARK_START};
    let text = format!(
        "a\n{MARK_START}7{MARK_ID_END}b\u{e100}\nc{MARK_START}8{MARK_ID_END}d\n{MARK_END}{MARK_END}\ne{MARK_ID_END}\n"
    );
    let (clean, marks) = units::strip_markers(&text);
    assert_eq!(clean, format!("a\nb\u{e100}\ncd\n\ne{MARK_ID_END}\n"));
    let spans: Vec<_> = marks
        .iter()
        .map(|m| (m.id, m.first, m.last, &clean[m.start..m.end]))
        .collect();
    assert_eq!(spans, vec![(8, 3, 4, "d\n"), (7, 2, 4, "b\u{e100}\ncd\n")]);
    let (clean, marks) = units::strip_markers("plain\n");
    assert_eq!((clean.as_str(), marks.len()), ("plain\n", 0));
}

/// minijinja's own filters that compare values (`sort`, `dictsort`, `unique`, `min`, `max`,
/// `groupby`) over values a tenant chooses, of every JSON kind and mixed: each answers, keeps
/// every item, and never panics (a panic aborts the controller, and everyone's updates).
#[test]
fn builtin_comparing_filters_take_any_mix_of_tenant_values() {
    let pool = [
        json!(10),
        json!(9.5),
        json!(-0.0),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!("10"),
        json!("9.5"),
        json!(""),
        json!("a"),
        json!("B"),
        json!(true),
        json!(false),
        json!(null),
        json!([1, "x"]),
        json!([]),
        json!({"a": 1}),
        json!({"b": "x", "a": [2]}),
    ];
    let template = "{% set items = resources.things.list() %}\
        {{ items | sort(attribute='data.v') | length }} \
        {{ items | sort(attribute='data.v', reverse=true) | length }} \
        {{ items | map(attribute='data.v') | sort | list | length }} \
        {{ items | map(attribute='data.v') | sort(case_sensitive=true) | list | length }} \
        {{ items | map(attribute='data.v') | unique | list | length > 0 }} \
        {{ (items | map(attribute='data.v') | min) is defined }} \
        {{ (items | map(attribute='data.v') | max) is defined }} \
        {{ items | groupby('data.v') | map(attribute='list') | map('length') | sum }} \
        {% for i in items %}{{ i.data | dictsort(by='value') | length }}{% endfor %}";
    let engine = Engine::new(&spec_with(template, &[], &[])).unwrap();
    let mut seed: u64 = 0x5851_f42d_4c95_7f2d;
    for round in 0..150 {
        let mut next = || crate::xorshift(&mut seed);
        let n = 1 + (next() % 40) as usize;
        let objects: Vec<Arc<Doc>> = (0..n)
            .map(|i| {
                let v = pool[(next() % pool.len() as u64) as usize].clone();
                let w = pool[(next() % pool.len() as u64) as usize].clone();
                doc(json!({"metadata": {"namespace": "t", "name": format!("o{i}"), "labels": {"group": "g"}},
                           "data": {"v": v, "w": w}}))
            })
            .collect();
        let out = engine
            .render(&inputs(&objects))
            .unwrap_or_else(|e| panic!("round {round}: {e}"))
            .haproxy_cfg
            .to_string();
        let expected = format!("{n} {n} {n} {n} True True True {n} {}", "2".repeat(n));
        assert_eq!(out.trim_end(), expected, "round {round}");
    }
}

/// A unit's output passed to another unit as an argument, in a loop (so the second call is
/// a replay candidate whose arguments are compared), and a collector holding itself passed to a
/// unit: both render or fail with an error, never panic (a panic aborts the controller).
#[test]
fn unit_outputs_as_arguments_and_self_holding_collectors_do_not_panic() {
    let engine = Engine::new(&spec_with(
        "{% for i in [1, 2] %}{{ unit('u', key='k', x=unit('v', key='v')) }}{% endfor %}\n",
        &[("u", "u:{{ x }}"), ("v", "v")],
        &[],
    ))
    .unwrap();
    let out = engine.render(&inputs(&[])).unwrap();
    assert_eq!(
        out.haproxy_cfg.matches("u:v").count(),
        2,
        "{}",
        out.haproxy_cfg
    );
    for (what, template) in [
        ("itself", "{% set c = collector() %}{% do c.append(c) %}"),
        ("itself in a list", "{% set c = collector() %}{% do c.extend([[c]]) %}"),
        (
            "each other",
            "{% set a = collector() %}{% set b = collector() %}{% do a.append(b) %}{% do b.append({'x': a}) %}",
        ),
        (
            "itself in shared",
            "{% do shared.append('k', 1) %}{% do shared.append('k', [shared.get('k')]) %}",
        ),
    ] {
        let engine = Engine::new(&spec_with(
            &format!("{template}{{{{ unit('u', key='k', x=1) }}}}\n"),
            &[("u", "u")],
            &[],
        ))
        .unwrap();
        let err = engine.render(&inputs(&[])).unwrap_err();
        assert!(err.message.contains("cannot hold itself"), "{what}: {err}");
    }
}
