//! kubectl's JSONPath templates (`-o jsonpath=...`): text with `{...}` actions — field
//! paths (`.a.b`, `['a.b']`, `[0]`, `[-1]`, `[1:3]`, `[*]`, `.*`, `..name`), filters
//! (`[?(@.type=="Ready")]`, `[?(@.x)]`), `{range ...}...{end}`, string literals
//! (`{"\n"}`) — printed as kubectl prints them: strings raw, everything else as JSON,
//! several results space-separated, a missing key as nothing. No crate implements
//! kubectl's template language; this is its documented grammar
//! (kubernetes.io/docs/reference/kubectl/jsonpath), parsed whole before anything runs.

use serde_json::Value;

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(Vec<Part>);

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Path(Vec<Step>),
    Range(Vec<Step>, Vec<Part>),
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Root,
    Field(String),
    Index(i64),
    All,
    Slice(Option<i64>, Option<i64>),
    Descend(String),
    Filter(Vec<Step>, Option<(Op, Value)>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Why a template cannot be read: what, and where in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("jsonpath {template:?}: {detail}")]
pub struct TemplateError {
    template: String,
    detail: String,
}

impl Template {
    /// Parse `text`; without any `{`, the whole text is one path (as in `.metadata.name`).
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let err = |detail: String| TemplateError {
            template: text.to_owned(),
            detail,
        };
        let actions = if text.contains('{') {
            split_actions(text).map_err(err)?
        } else {
            vec![Token::Action(text.to_owned())]
        };
        // Ranges nest: a stack of (path, parts so far).
        let mut stack: Vec<(Option<Vec<Step>>, Vec<Part>)> = vec![(None, Vec::new())];
        for token in actions {
            let parts = &mut stack.last_mut().ok_or_else(|| err("unbalanced".into()))?.1;
            match token {
                Token::Text(t) => parts.push(Part::Text(t)),
                Token::Action(action) => {
                    let action = action.trim();
                    if let Some(path) = action.strip_prefix("range ") {
                        let path = parse_path(path.trim()).map_err(err)?;
                        stack.push((Some(path), Vec::new()));
                    } else if action == "end" {
                        let (path, body) = stack.pop().ok_or_else(|| err("unbalanced".into()))?;
                        let path = path.ok_or_else(|| err("{end} without {range}".into()))?;
                        let parts = &mut stack
                            .last_mut()
                            .ok_or_else(|| err("{end} without {range}".into()))?
                            .1;
                        parts.push(Part::Range(path, body));
                    } else if action.starts_with('"') {
                        parts.push(Part::Text(unquote(action).map_err(err)?));
                    } else if action.is_empty() {
                        return Err(err("an empty {}".into()));
                    } else {
                        parts.push(Part::Path(parse_path(action).map_err(err)?));
                    }
                }
            }
        }
        match stack.pop() {
            Some((None, parts)) if stack.is_empty() => Ok(Self(parts)),
            _ => Err(err("{range} without {end}".into())),
        }
    }

    /// The template applied to `root`.
    pub fn render(&self, root: &Value) -> String {
        let mut out = String::new();
        render(&self.0, root, root, &mut out);
        out
    }
}

enum Token {
    Text(String),
    Action(String),
}

/// Text and `{...}` actions; a `}` inside a quoted string does not end an action.
fn split_actions(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            tokens.push(Token::Text(rest[..open].to_owned()));
        }
        let body = &rest[open + 1..];
        let mut quote = None;
        let mut escaped = false;
        let mut close = None;
        for (i, c) in body.char_indices() {
            match (quote, c) {
                (Some(_), '\\') if !escaped => {
                    escaped = true;
                    continue;
                }
                (Some(q), c) if c == q && !escaped => quote = None,
                (None, '"' | '\'') => quote = Some(c),
                (None, '}') => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
            escaped = false;
        }
        let close = close.ok_or_else(|| format!("no }} after byte {open}"))?;
        tokens.push(Token::Action(body[..close].to_owned()));
        rest = &body[close + 1..];
    }
    if !rest.is_empty() {
        tokens.push(Token::Text(rest.to_owned()));
    }
    Ok(tokens)
}

/// A quoted literal with `\n`, `\t`, `\\`, `\"` and `\'`.
fn unquote(text: &str) -> Result<String, String> {
    let quote = text.chars().next().unwrap_or('"');
    let inner = text
        .strip_prefix(quote)
        .and_then(|t| t.strip_suffix(quote))
        .ok_or_else(|| format!("{text}: an unterminated string"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => return Err(format!("{text}: a lone \\ at the end")),
        }
    }
    Ok(out)
}

fn parse_path(text: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut rest = text;
    if let Some(r) = rest.strip_prefix('$') {
        steps.push(Step::Root);
        rest = r;
    } else if let Some(r) = rest.strip_prefix('@') {
        rest = r;
    }
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("..") {
            let (name, r) = take_name(r);
            if name.is_empty() {
                return Err(format!("{text}: a name after .."));
            }
            steps.push(Step::Descend(name.to_owned()));
            rest = r;
        } else if let Some(r) = rest.strip_prefix(".*") {
            steps.push(Step::All);
            rest = r;
        } else if let Some(r) = rest.strip_prefix('.') {
            let (name, r) = take_name(r);
            if !name.is_empty() {
                steps.push(Step::Field(name.to_owned()));
            }
            rest = r;
        } else if let Some(r) = rest.strip_prefix('[') {
            let close = bracket_end(r).ok_or_else(|| format!("{text}: [ without ]"))?;
            steps.push(parse_bracket(r[..close].trim()).map_err(|e| format!("{text}: {e}"))?);
            rest = &r[close + 1..];
        } else {
            return Err(format!("{text}: unexpected {rest:?}"));
        }
    }
    Ok(steps)
}

/// A field name: up to the next `.` or `[`.
fn take_name(text: &str) -> (&str, &str) {
    let end = text.find(['.', '[']).unwrap_or(text.len());
    text.split_at(end)
}

/// Where the `]` closing a bracket is (quotes and nested brackets skipped).
fn bracket_end(text: &str) -> Option<usize> {
    let mut depth = 0;
    let mut quote = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return Some(i),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn parse_bracket(inner: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::All);
    }
    if inner.starts_with('\'') || inner.starts_with('"') {
        return Ok(Step::Field(unquote(inner)?));
    }
    if let Some(filter) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
        return parse_filter(filter.trim());
    }
    if let Some((from, to)) = inner.split_once(':') {
        let bound = |b: &str| -> Result<Option<i64>, String> {
            let b = b.trim();
            if b.is_empty() {
                return Ok(None);
            }
            b.parse()
                .map(Some)
                .map_err(|_| format!("[{inner}]: not a slice"))
        };
        let to = to.split(':').next().unwrap_or("");
        return Ok(Step::Slice(bound(from)?, bound(to)?));
    }
    inner
        .parse()
        .map(Step::Index)
        .map_err(|_| format!("[{inner}]: expected *, an index, a slice, 'name' or ?(...)"))
}

fn parse_filter(filter: &str) -> Result<Step, String> {
    const OPS: [(&str, Op); 6] = [
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("<", Op::Lt),
        (">", Op::Gt),
    ];
    for (symbol, op) in OPS {
        if let Some((left, right)) = filter.split_once(symbol) {
            let right = right.trim();
            let literal = if right.starts_with('"') || right.starts_with('\'') {
                Value::String(unquote(right)?)
            } else {
                serde_json::from_str(right)
                    .map_err(|_| format!("?({filter}): {right} is neither a string nor a number"))?
            };
            return Ok(Step::Filter(parse_path(left.trim())?, Some((op, literal))));
        }
    }
    Ok(Step::Filter(parse_path(filter)?, None))
}

fn render(parts: &[Part], root: &Value, current: &Value, out: &mut String) {
    for part in parts {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Path(path) => {
                let found = eval(path, root, current);
                let shown: Vec<String> = found.iter().map(|v| show(v)).collect();
                out.push_str(&shown.join(" "));
            }
            Part::Range(path, body) => {
                for item in eval(path, root, current) {
                    // Ranging over one list: its elements.
                    match item {
                        Value::Array(items) if path_ends_in_one(path) => {
                            for element in items {
                                render(body, root, element, out);
                            }
                        }
                        item => render(body, root, item, out),
                    }
                }
            }
        }
    }
}

/// A path naming one value (no `[*]`, slice, filter or `..`): ranging over it ranges
/// over its elements.
fn path_ends_in_one(path: &[Step]) -> bool {
    path.iter()
        .all(|s| matches!(s, Step::Root | Step::Field(_) | Step::Index(_)))
}

fn show(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn eval<'a>(path: &[Step], root: &'a Value, current: &'a Value) -> Vec<&'a Value> {
    let mut values = vec![current];
    for step in path {
        let mut next = Vec::new();
        for value in values {
            apply(step, root, value, &mut next);
        }
        values = next;
    }
    values
}

fn apply<'a>(step: &Step, root: &'a Value, value: &'a Value, out: &mut Vec<&'a Value>) {
    match step {
        Step::Root => out.push(root),
        Step::Field(name) => out.extend(value.get(name.as_str())),
        Step::Index(i) => {
            if let Value::Array(items) = value {
                out.extend(index(items.len(), *i).and_then(|i| items.get(i)));
            }
        }
        Step::All => match value {
            Value::Array(items) => out.extend(items.iter()),
            Value::Object(map) => out.extend(map.values()),
            _ => {}
        },
        Step::Slice(from, to) => {
            if let Value::Array(items) = value {
                let len = items.len();
                let clamp = |b: i64| -> usize {
                    if b < 0 {
                        len.saturating_sub(b.unsigned_abs() as usize)
                    } else {
                        (b as usize).min(len)
                    }
                };
                let start = from.map_or(0, clamp);
                let end = to.map_or(len, clamp);
                if start < end {
                    out.extend(&items[start..end]);
                }
            }
        }
        Step::Descend(name) => descend(name, value, out),
        Step::Filter(path, test) => {
            let candidates: Vec<&Value> = match value {
                Value::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            for candidate in candidates {
                let found = eval(path, root, candidate);
                let keep = match test {
                    None => !found.is_empty(),
                    Some((op, literal)) => found.iter().any(|v| compare(v, *op, literal)),
                };
                if keep {
                    out.push(candidate);
                }
            }
        }
    }
}

fn index(len: usize, i: i64) -> Option<usize> {
    if i < 0 {
        len.checked_sub(i.unsigned_abs() as usize)
    } else {
        Some(i as usize)
    }
}

fn descend<'a>(name: &str, value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            out.extend(map.get(name));
            for child in map.values() {
                descend(name, child, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                descend(name, child, out);
            }
        }
        _ => {}
    }
}

fn compare(value: &Value, op: Op, literal: &Value) -> bool {
    use std::cmp::Ordering;
    let ordering = match (value, literal) {
        (Value::Number(a), Value::Number(b)) => a
            .as_f64()
            .zip(b.as_f64())
            .and_then(|(a, b)| a.partial_cmp(&b)),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (a, b) => (a == b).then_some(Ordering::Equal),
    };
    match op {
        Op::Eq => ordering == Some(Ordering::Equal),
        Op::Ne => ordering != Some(Ordering::Equal),
        Op::Lt => ordering == Some(Ordering::Less),
        Op::Le => matches!(ordering, Some(Ordering::Less | Ordering::Equal)),
        Op::Gt => ordering == Some(Ordering::Greater),
        Op::Ge => matches!(ordering, Some(Ordering::Greater | Ordering::Equal)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn render(template: &str, value: &Value) -> String {
        Template::parse(template).unwrap().render(value)
    }

    fn list() -> Value {
        serde_json::json!({
            "kind": "List",
            "items": [
                {"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "web"}},
                 "status": {"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]}},
                {"metadata": {"name": "b"}, "status": {"succeeded": 0, "conditions": []}},
                {"metadata": {"name": "c"}, "status": {"succeeded": 5}},
            ]
        })
    }

    #[test]
    fn kubectls_documented_examples_print_as_kubectl_prints_them() {
        let l = list();
        assert_eq!(render("{.items[*].metadata.name}", &l), "a b c");
        assert_eq!(render("{.items[0].metadata.name}", &l), "a");
        assert_eq!(render("{.items[-1].metadata.name}", &l), "c");
        assert_eq!(render("{.items[0:2].metadata.name}", &l), "a b");
        assert_eq!(render("{..name}", &l), "a b c");
        assert_eq!(
            render(
                r#"{range .items[*]}{.metadata.name}{"\t"}{.status.succeeded}{"\n"}{end}"#,
                &l
            ),
            "a\t2\nb\t0\nc\t5\n"
        );
        assert_eq!(
            render("{.items[?(@.status.succeeded>1)].metadata.name}", &l),
            "a c"
        );
        assert_eq!(
            render(r#"{.items[?(@.metadata.name=="b")].status.succeeded}"#, &l),
            "0"
        );
        assert_eq!(
            render("{.items[0].metadata.labels['app.kubernetes.io/name']}", &l),
            "web"
        );
        assert_eq!(
            render(
                r#"{.items[0].status.conditions[?(@.type=="Complete")].status}"#,
                &l
            ),
            "True"
        );
        // Objects as JSON; text around actions kept; a bare path is one action.
        assert_eq!(
            render("name={.items[1].metadata}", &l),
            r#"name={"name":"b"}"#
        );
        assert_eq!(render(".items[2].metadata.name", &l), "c");
        // Ranging over one list ranges over its elements.
        assert_eq!(
            render("{range .items}[{.metadata.name}]{end}", &l),
            "[a][b][c]"
        );
        // A missing key prints nothing, as kubectl's default --allow-missing-template-keys.
        assert_eq!(render("{.items[0].spec.nothing}", &l), "");
        assert_eq!(render("{.items[9].metadata.name}", &l), "");
    }

    #[test]
    fn broken_templates_are_refused_before_anything_prints() {
        for bad in [
            "{.items[*}",
            "{range .items[*]}{.x}",
            "{end}",
            "{.items[abc]}",
            "{.a}{",
            r#"{"unterminated}"#,
            "{}",
            "{.items[?(@.a==x)]}",
        ] {
            let err = Template::parse(bad);
            assert!(err.is_err(), "{bad} was accepted: {err:?}");
        }
    }
}
