//! Settings: flags over the file over the defaults, and what each refuses.
use super::*;

fn write(dir: &Path, text: &str) {
    std::fs::write(dir.join(CONFIG_FILE), text).unwrap();
}

#[test]
fn flags_override_the_file_which_overrides_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = resolve(dir.path(), &Options::default()).unwrap();
    assert_eq!(defaults.listen[0].to_string(), "/ip4/0.0.0.0/tcp/4001");
    assert!(defaults.host.is_none() && !defaults.mdns);
    write(
        dir.path(),
        &format!(
            "listen = [\"/ip4/127.0.0.1/tcp/5000\"]\nmdns = true\nhost = true\nprice = \"2.50\"\nregion = \"eu\"\nimages = [\"sha256:{}\"]\n",
            "ab".repeat(32)
        ),
    );
    // `listen` from the file is honoured.
    let file = resolve(dir.path(), &Options::default()).unwrap();
    assert_eq!(file.listen[0].to_string(), "/ip4/127.0.0.1/tcp/5000");
    assert!(file.mdns);
    let host = file.host.unwrap();
    assert_eq!(
        (host.price.0, host.region.as_str(), host.republish_s),
        (2_500_000, "eu", 120)
    );
    let flags = Options {
        price: Some("3".into()),
        listen: Some(vec!["/ip4/127.0.0.1/tcp/6000".into()]),
        ..Options::default()
    };
    let both = resolve(dir.path(), &flags).unwrap();
    assert_eq!(both.listen[0].to_string(), "/ip4/127.0.0.1/tcp/6000");
    assert_eq!(both.host.unwrap().price.0, 3_000_000);
    // Where each came from.
    let effective = flags.effective(dir.path()).unwrap();
    let source = |k| {
        effective
            .sources
            .iter()
            .find(|(key, _)| *key == k)
            .unwrap()
            .1
    };
    assert_eq!(source("listen"), Source::Flag);
    assert_eq!(source("mdns"), Source::File);
    assert_eq!(source("republish_s"), Source::Default);
    assert_eq!(source("ledger"), Source::Unset);
    let text = effective.to_toml();
    assert!(
        text.contains("listen = [\"/ip4/127.0.0.1/tcp/6000\"]  # flag"),
        "{text}"
    );
    assert!(text.contains("mdns = true  # config.toml"), "{text}");
    assert!(text.contains("republish_s = 120  # default"), "{text}");
    assert!(text.contains("# ledger is not set"), "{text}");
}

#[test]
fn a_faucet_key_is_for_a_ledger_and_must_be_a_peer_id() {
    let dir = tempfile::tempdir().unwrap();
    let faucet = gpux_protocol::Keypair::from_seed(&[3; 32])
        .peer_id()
        .to_string();
    let ledger = |serve: bool, faucet: &str| Options {
        serve_ledger: Some(serve),
        ledger_faucet: Some(faucet.into()),
        ..Options::default()
    };
    let config = resolve(dir.path(), &ledger(true, &faucet)).unwrap();
    assert_eq!(
        config
            .serve_ledger
            .unwrap()
            .faucet
            .map(|k| k.peer_id().to_string()),
        Some(faucet.clone())
    );
    let err = resolve(dir.path(), &ledger(false, &faucet))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ledger_faucet") && err.contains("--serve-ledger"),
        "{err}"
    );
    let err = resolve(dir.path(), &ledger(true, "not-a-peer"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ledger_faucet") && err.contains("not-a-peer"),
        "{err}"
    );
}

#[test]
fn a_bad_file_is_named_with_its_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "mdns = true\nlistn = []\n");
    let err = resolve(dir.path(), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.toml") && err.contains("listn") && err.contains("line 2"),
        "{err}"
    );
    write(dir.path(), "mdns = true\n\nreceipt_interval_s = 0\n");
    let err = resolve(dir.path(), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("receipt_interval_s") && err.contains("line 3"),
        "{err}"
    );
    write(dir.path(), "listen = [\"not an address\"]\n");
    let err = resolve(dir.path(), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 1") && err.contains("listen") && err.contains("not an address"),
        "{err}"
    );
    // A bad flag is named as a flag.
    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    let flags = Options {
        receipt_interval_s: Some(0),
        ..Options::default()
    };
    let err = resolve(dir.path(), &flags).unwrap_err().to_string();
    assert!(err.contains("--receipt-interval"), "{err}");
}

#[test]
fn prices_and_durations_beyond_the_protocol_s_bounds_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |text: &str, key: &str| {
        write(dir.path(), text);
        let err = resolve(dir.path(), &Options::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{text}: {err}");
        err
    };
    let err = refused("host = true\nprice = \"20000\"\n", "price");
    assert!(err.contains("at most 10000"), "{err}");
    refused("host = true\nprice = \"-1\"\n", "price");
    refused("host = true\nprice = \"0\"\n", "price");
    refused(
        "host = true\nprice = \"2\"\nspot_floor = \"3\"\n",
        "spot_floor",
    );
    refused(
        "host = true\nmax_duration_s = 4294967294\n",
        "max_duration_s",
    );
    refused(
        "host = true\nmin_duration_s = 7200\nmax_duration_s = 3600\n",
        "min_duration_s",
    );
    write(dir.path(), "host = true\nprice = \"10000\"\n");
    resolve(dir.path(), &Options::default()).unwrap();
}
