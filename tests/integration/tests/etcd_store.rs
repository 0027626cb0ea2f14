//! The etcd store meets the same contract as the embedded one, against a real etcd.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use rigger_controller::store::{EtcdStore, Store, conformance};
use rigger_integration_tests::Etcd;

#[tokio::test]
async fn etcd_store_meets_the_store_contract() {
    let etcd = Etcd::start();
    let store = EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), "/itest/")
        .await
        .unwrap();
    conformance(&Store::Etcd(Box::new(store))).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_etcd_is_one_clear_line() {
    let port = rigger_integration_tests::free_port();
    let err = EtcdStore::connect(&[format!("127.0.0.1:{port}")], "/itest/")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("store etcd://127.0.0.1:{port}: ")),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}
