//! What operators look at, proven on the real tools: Debian's Prometheus scrapes a
//! controller and an agent of the lab and finds every series the operator guide
//! documents; every dashboard panel's query and every alert's expression runs there and
//! names only series that exist; the alert rules pass `promtool check rules` and their
//! unit tests (`promtool test rules`), with a case where each alert fires and one where
//! it stays quiet.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rigger_integration_tests::{
    Agent, Controller, Daemon, Lab, free_port, http_get, plain_http_hosts_dir, repo_root,
    wait_until,
};
use serde_json::Value;

fn deploy(path: &str) -> PathBuf {
    repo_root().join("deploy").join(path)
}

/// The series the operator guide's tables list (Health and metrics), as Prometheus
/// names them: a histogram is its `_bucket`, `_sum` and `_count`.
fn documented_series() -> BTreeSet<String> {
    let guide = std::fs::read_to_string(repo_root().join("docs/operator-guide.md")).unwrap();
    let mut names = BTreeSet::new();
    for line in guide.lines() {
        let Some(rest) = line.strip_prefix("| `rigger_") else {
            continue;
        };
        let (name, rest) = rest.split_once('`').unwrap();
        let name = format!("rigger_{name}");
        let kind = rest
            .trim_start_matches([' ', '|'])
            .split(' ')
            .next()
            .unwrap();
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        } else {
            names.insert(name);
        }
    }
    assert!(
        names.len() > 20,
        "the guide's tables were not found: {names:?}"
    );
    names
}

/// The series names an expression reads: `rigger_*` identifiers, and `up`.
fn series_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        let quoted_label = c == '=' || c == '!';
        if word.starts_with("rigger_") || (word == "up" && !quoted_label) {
            names.insert(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every query of a dashboard's panels (rows' panels included), with its panel's title.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            walk(&panel["panels"], out);
            if panel["type"] == "row" {
                continue;
            }
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            let targets = panel["targets"].as_array();
            assert!(
                targets.is_some_and(|t| !t.is_empty()),
                "panel {title:?} has no query"
            );
            for target in targets.into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target without expr: {target}"));
                out.push((title.clone(), expr.to_owned()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The alerting rules: (name, expression).
fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy("prometheus/rigger-alerts.yaml")).unwrap();
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_sequence().unwrap())
        .filter_map(|rule| {
            Some((
                rule["alert"].as_str()?.to_owned(),
                rule["expr"].as_str().unwrap().to_owned(),
            ))
        })
        .collect()
}

fn promtool(args: &[&Path]) -> String {
    let out = Command::new("promtool")
        .arg(args[0])
        .args(&args[1..])
        .output()
        .expect("promtool (Debian's prometheus package: scripts/lab install)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_with_a_firing_and_a_quiet_case_for_each_alert() {
    let rules = deploy("prometheus/rigger-alerts.yaml");
    let tests = deploy("prometheus/rigger-alerts.test.yaml");
    promtool(&[Path::new("check"), Path::new("rules"), &rules]);
    promtool(&[Path::new("test"), Path::new("rules"), &tests]);

    let text = std::fs::read_to_string(&tests).unwrap();
    let cases: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let (mut firing, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in cases["tests"].as_sequence().unwrap() {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            match case["exp_alerts"].as_sequence() {
                Some(alerts) if !alerts.is_empty() => firing.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    let alerts: Vec<String> = alert_rules().into_iter().map(|(name, _)| name).collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for alert in &alerts {
        assert!(
            firing.contains(alert),
            "{alert}: no test case where it fires"
        );
        assert!(
            quiet.contains(alert),
            "{alert}: no test case where it stays quiet"
        );
    }
}

#[test]
fn prometheus_scrapes_every_documented_series_and_every_query_names_one_that_exists() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let hosts = plain_http_hosts_dir(dir.path(), &[&lab.registry]);
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let agent = Agent::start(
        &controller,
        "scraped-node",
        &lab.containerd_address,
        &hosts,
        "itest-scraped",
        &state,
    );

    // The job names are the ones the alert rules assume.
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: rigger-controller\n  static_configs: [{{targets: ['{}']}}]\n- job_name: rigger-agent\n  static_configs: [{{targets: ['{}']}}]\n",
            controller.health, agent.health
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = Daemon::spawn(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log),
    );
    let api = |path: &str| -> Option<Value> {
        let (code, body) = http_get(&web, path)?;
        (code == 200).then(|| serde_json::from_str(&body).unwrap())
    };

    let documented = documented_series();
    // The series names Prometheus holds now.
    let present = || -> BTreeSet<String> {
        api("/api/v1/label/__name__/values").map_or_else(BTreeSet::new, |names| {
            names["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_owned())
                .collect()
        })
    };
    let names = wait_until(
        "Prometheus to have scraped every documented series",
        Duration::from_secs(60),
        || {
            let names = present();
            documented.is_subset(&names).then_some(names)
        },
    );
    let up = api("/api/v1/query?query=up").unwrap();
    let jobs: BTreeSet<&str> = up["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["value"][1] == "1")
        .map(|r| r["metric"]["job"].as_str().unwrap())
        .collect();
    assert_eq!(jobs, BTreeSet::from(["rigger-agent", "rigger-controller"]));
    // What a daemon serves that the guide does not list is a gap in the guide.
    let served: BTreeSet<&String> = names.iter().filter(|n| n.starts_with("rigger_")).collect();
    let undocumented: Vec<_> = served
        .into_iter()
        .filter(|n| !documented.contains(*n))
        .collect();
    assert!(
        undocumented.is_empty(),
        "served but not in the operator guide: {undocumented:?}"
    );

    // Every query of the dashboards and the alert rules runs and reads existing series.
    let mut queries: Vec<(String, String)> = Vec::new();
    for file in [
        "grafana/rigger-agent.json",
        "grafana/rigger-controller.json",
    ] {
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(deploy(file)).unwrap())
                .unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
        let found = dashboard_queries(&dashboard);
        assert!(found.len() >= 5, "{file}: {} queries", found.len());
        queries.extend(
            found
                .into_iter()
                .map(|(title, expr)| (format!("{file}: {title}"), expr)),
        );
    }
    queries.extend(
        alert_rules()
            .into_iter()
            .map(|(name, expr)| (format!("alert {name}"), expr)),
    );
    for (place, expr) in &queries {
        let read = series_in(expr);
        assert!(!read.is_empty(), "{place}: reads no series: {expr}");
        for name in &read {
            assert!(
                names.contains(name) || name == "up",
                "{place}: {name} is not a series Prometheus has: {expr}"
            );
        }
        let runnable = expr
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "1m")
            .replace("$instance", ".*")
            .replace("${instance}", ".*");
        let answer = api(&format!(
            "/api/v1/query?query={}",
            percent_encoded(&runnable)
        ))
        .unwrap_or_else(|| panic!("{place}: Prometheus refused the query: {runnable}"));
        assert_eq!(answer["status"], "success", "{place}: {runnable}: {answer}");
    }
}
