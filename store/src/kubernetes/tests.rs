use serde_json::json;

use super::definitions::conversion_refused;

#[test]
fn a_crd_converting_through_a_webhook_is_refused_alone_and_named() {
    let versions =
        json!([{"name": "v1alpha1", "served": true}, {"name": "v1beta1", "served": true}]);
    let kruises = json!({"spec": {"versions": versions, "conversion": {"strategy": "Webhook",
        "webhook": {"clientConfig": {"service": {"namespace": "kruise-system",
                                                  "name": "kruise-webhook-service"}},
                    "conversionReviewVersions": ["v1"]}}}});
    let name = "containerrecreaterequests.apps.kruise.io";
    let refused = conversion_refused(name, &kruises, false).expect("refused");
    assert!(refused.starts_with(name), "{refused}");
    assert!(
        refused.contains("kruise-system/kruise-webhook-service"),
        "{refused}"
    );
    assert!(refused.contains("conversion: None"), "{refused}");
    assert_eq!(
        conversion_refused(name, &kruises, true),
        None,
        "beside Kruise's manager"
    );
    for rigger in [
        json!({"spec": {"versions": versions}}),
        json!({"spec": {"versions": versions, "conversion": {"strategy": "None"}}}),
    ] {
        assert_eq!(conversion_refused(name, &rigger, false), None, "{rigger}");
    }
    // One version served: never converted, whatever the strategy.
    let mut one = kruises;
    one["spec"]["versions"] =
        json!([{"name": "v1beta1", "served": true}, {"name": "v1alpha1", "served": false}]);
    assert_eq!(conversion_refused(name, &one, false), None);
}
