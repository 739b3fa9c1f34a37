//! `gpux ledger restore` on a real ledger node: its database lost, the node refuses to
//! start, the restore brings back every balance.

use std::path::Path;

use super::market::new_node;

#[test]
fn a_ledger_that_lost_its_database_refuses_to_start_until_restored_with_its_balances() {
    let tmp = tempfile::tempdir().unwrap();
    let mut ledger = new_node(tmp.path(), "ledger", vec!["--serve-ledger".into()], vec![]);
    ledger.spawn();
    let accounts: Vec<String> = (1u8..=3)
        .map(|i| {
            gpux_protocol::Keypair::from_seed(&[i; 32])
                .peer_id()
                .to_string()
        })
        .collect();
    let mint = |ledger: &super::market::Node, account: &str, amount: &str| {
        ledger
            .api()
            .mint(&gpux_api::MintRequest {
                account: account.into(),
                amount: amount.into(),
                grant: None,
            })
            .unwrap()
            .balance_micro
    };
    for (i, account) in accounts.iter().enumerate() {
        mint(&ledger, account, &format!("{}", i + 1));
    }
    assert!(ledger.stop(10), "the ledger stops on SIGTERM");

    // The disk loses the database's log file.
    std::fs::remove_file(ledger.dir.join("db").join("db")).unwrap();
    let refused = gpux_testnet::harness::Node::spawn(&mut ledger);
    let err = format!("{:#}", refused.unwrap_err());
    let log = ledger.log();
    assert!(log.contains("gpux ledger restore"), "{err}\n{log}");

    let out = ledger.gpux(&["ledger", "restore"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("3 log entries verified and replayed, 3 accounts"),
        "{text}"
    );
    assert!(text.contains("db.damaged-"), "{text}");

    ledger.spawn();
    for (i, account) in accounts.iter().enumerate() {
        // One more micro-credit shows the balance the ledger had.
        let balance = mint(&ledger, account, "0.000001");
        assert_eq!(balance, (i as u64 + 1) * 1_000_000 + 1, "{account}");
    }
    assert!(Path::new(&ledger.dir).join("ledger.copy").exists());
}

#[test]
fn a_ledger_with_a_faucet_mints_only_the_faucets_grants() {
    let tmp = tempfile::tempdir().unwrap();
    // The faucet's key in a directory of its own, the ledger told its peer id.
    let faucet = tmp.path().join("faucet");
    let (key, _) = gpux_node::init_key(&faucet).unwrap();
    let impostor = tmp.path().join("impostor");
    gpux_node::init_key(&impostor).unwrap();
    let mut ledger = new_node(
        tmp.path(),
        "ledger",
        vec![
            "--serve-ledger".into(),
            "--ledger-faucet".into(),
            key.peer_id().to_string(),
        ],
        vec![],
    );
    ledger.spawn();
    let account = gpux_protocol::Keypair::from_seed(&[4; 32])
        .peer_id()
        .to_string();
    // The operator's unsigned mint is refused, and says how to mint.
    let out = ledger.gpux(&["mint", &account, "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpux mint --faucet DIR"), "{err}");
    // A grant signed by another key is refused.
    let faucet_arg = faucet.display().to_string();
    let impostor_arg = impostor.display().to_string();
    let out = ledger.gpux(&["mint", &account, "5", "--faucet", &impostor_arg]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WrongSigner"), "{err}");
    // The faucet's grants are applied, each once.
    for expected in ["5", "10"] {
        let out = ledger.gpux(&["mint", &account, "5", "--faucet", &faucet_arg, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let minted: serde_json::Value = serde_json::from_str(&text).unwrap();
        let balance = expected.parse::<u64>().unwrap() * 1_000_000;
        assert_eq!(minted["balance_micro"], balance, "{text}");
    }
    let status = ledger.gpux(&["ledger", "status", "--json"]);
    let totals: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(totals["minted_micro"], 10_000_000u64);
}
