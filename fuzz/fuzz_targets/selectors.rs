//! Selector strings as `riggerctl get -l/--field-selector` sends them and the
//! controller reads them from any viewer: never a panic, and a label selector the
//! kubectl grammar accepts is one the object validator accepts too (the same rules for
//! keys and values on both paths).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use rigger_api::selectors::{FieldSelector, parse_label_selector_or_all};

fuzz_target!(|text: &str| {
    // Labels to match against, from the input itself: "k=v" pairs split at ';'.
    let labels: BTreeMap<String, String> = text
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    if let Ok(selector) = parse_label_selector_or_all(text) {
        assert!(
            selector.validate("selector").is_ok(),
            "{text:?} parsed into {selector:?}, which the validator refuses"
        );
        let _ = selector.matches(&labels);
    }
    if let Ok(fields) = FieldSelector::parse(text) {
        let _ = fields.matches(text, text);
    }
});
