//! kubectl's selector strings, as `-l`/`--selector` and `--field-selector` take them:
//! `app=web,tier!=db,zone in (a,b),env notin (dev),ready,!drain` and
//! `metadata.name=warm,metadata.namespace!=kube-system`. The controller applies them
//! when it lists, so only what matches crosses the wire.

use crate::fields::{
    LabelSelector, LabelSelectorRequirement, SelectorOperator, check_label_key, check_label_value,
};

/// A label selector string read into Kubernetes' [`LabelSelector`].
pub fn parse_label_selector(text: &str) -> Result<LabelSelector, String> {
    let mut selector = LabelSelector::default();
    for term in split_terms(text)? {
        let term = term.trim();
        if term.is_empty() {
            return Err(format!("{text:?}: an empty requirement"));
        }
        let requirement = if let Some(key) = term.strip_prefix('!') {
            requirement(key.trim(), SelectorOperator::DoesNotExist, Vec::new())?
        } else if let Some((key, value)) = term.split_once("!=") {
            requirement(key.trim(), SelectorOperator::NotIn, vec![value.trim()])?
        } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            requirement(key.trim(), SelectorOperator::In, vec![value.trim()])?
        } else if let Some((key, values)) = set_term(term, " notin ")? {
            requirement(key, SelectorOperator::NotIn, values)?
        } else if let Some((key, values)) = set_term(term, " in ")? {
            requirement(key, SelectorOperator::In, values)?
        } else {
            requirement(term, SelectorOperator::Exists, Vec::new())?
        };
        selector.match_expressions.push(requirement);
    }
    Ok(selector)
}

/// [`parse_label_selector`], where an empty string selects everything.
pub fn parse_label_selector_or_all(text: &str) -> Result<LabelSelector, String> {
    if text.trim().is_empty() {
        Ok(LabelSelector::default())
    } else {
        parse_label_selector(text)
    }
}

/// Requirements split at commas outside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("{text:?}: ) without ("))?;
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: ( without )"));
    }
    terms.push(&text[start..]);
    Ok(terms)
}

/// `key in (a,b)` / `key notin (a,b)`.
fn set_term<'a>(term: &'a str, op: &str) -> Result<Option<(&'a str, Vec<&'a str>)>, String> {
    let Some((key, rest)) = term.split_once(op) else {
        return Ok(None);
    };
    let values = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("{term:?}: expected{op}(v1,v2)"))?;
    let values: Vec<&str> = values.split(',').map(str::trim).collect();
    Ok(Some((key.trim(), values)))
}

fn requirement(
    key: &str,
    operator: SelectorOperator,
    values: Vec<&str>,
) -> Result<LabelSelectorRequirement, String> {
    check_label_key(key)?;
    if let Some(bad) = values.iter().find(|v| !check_label_value(v)) {
        return Err(format!("{bad:?} is not a valid label value"));
    }
    Ok(LabelSelectorRequirement {
        key: key.to_owned(),
        operator,
        values: values.into_iter().map(str::to_owned).collect(),
    })
}

/// The fields a field selector may name: every kind has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
}

/// `--field-selector`: terms on `metadata.name` and `metadata.namespace`, all of which
/// must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(Field, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("{term:?}: expected FIELD=VALUE or FIELD!=VALUE"));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => {
                    return Err(format!(
                        "{other:?} is not a field Rigger selects on (metadata.name, metadata.namespace)"
                    ));
                }
            };
            terms.push((field, equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    /// No terms: every object matches.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, name: &str, namespace: &str) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = match field {
                Field::Name => name,
                Field::Namespace => namespace,
            };
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn label_selectors_read_and_match_as_kubectls() {
        let s =
            parse_label_selector("app=web,tier!=db,zone in (a, b),env notin (dev),ready,!drain")
                .unwrap();
        let fits = labels(&[
            ("app", "web"),
            ("zone", "a"),
            ("env", "prod"),
            ("ready", ""),
        ]);
        assert!(s.matches(&fits));
        let mut no = fits.clone();
        no.insert("tier".into(), "db".into());
        assert!(!s.matches(&no));
        let mut no = fits.clone();
        no.insert("drain".into(), "yes".into());
        assert!(!s.matches(&no));
        let mut no = fits;
        no.insert("zone".into(), "c".into());
        assert!(!s.matches(&no));
        assert!(
            !s.matches(&labels(&[("app", "web"), ("zone", "a")])),
            "ready is required"
        );
        assert!(
            parse_label_selector("app==web")
                .unwrap()
                .matches(&labels(&[("app", "web")]))
        );
        for bad in [
            "",
            "a,,b",
            "zone in a,b",
            "zone in (a",
            "bad key!=x",
            "a=b c",
            "a)",
        ] {
            assert!(parse_label_selector(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn field_selectors_take_name_and_namespace() {
        let s = FieldSelector::parse("metadata.name=warm,metadata.namespace!=kube-system").unwrap();
        assert!(s.matches("warm", "default"));
        assert!(!s.matches("warm", "kube-system"));
        assert!(!s.matches("cold", "default"));
        assert!(FieldSelector::parse("").unwrap().matches("any", "thing"));
        assert!(FieldSelector::parse(" , ").unwrap().is_empty());
        assert!(!s.is_empty());
        assert!(FieldSelector::parse("status.phase=Running").is_err());
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
