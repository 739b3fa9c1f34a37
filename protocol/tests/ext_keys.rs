//! `ext` is for optional extras: a message without one still means what it meant. Money and
//! lease terms are typed fields (`LeaseRequest.terms`, `Offer.terms`, `LeaseAccept`'s timing,
//! `UsageReceipt.workspace_charge`). This fails when an `EXT_` key appears anywhere in the
//! workspace that is not one of the extras below, each with why it is one.

use std::path::{Path, PathBuf};

/// The ext keys left, and why each is an optional extra.
const EXTRAS: [(&str, &str); 5] = [
    (
        "EXT_REJECT_FREE_GPUS",
        "a refusal's hint of GPUs to ask for instead; without it the renter tries elsewhere",
    ),
    (
        "EXT_LOCK_HOLD_UNTIL",
        "an escrow lock's hold, repeating the acceptance's signed start for the ledger",
    ),
    (
        "EXT_RELEASE_ACK",
        "a release's voucher, evidence the ledger pays first; without it nothing is owed",
    ),
    (
        "EXT_RELEASE_END",
        "how the lease ended, for reputation; the release means the same without it",
    ),
    (
        "EXT_RECORD_VOUCHER_PAID",
        "what the ledger's record says a voucher paid, a receipt of the ledger's own act",
    ),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_ext_key_carries_a_money_or_lease_term() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 100, "only {} source files found", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines() {
            let Some(at) = line.find("const EXT_") else {
                continue;
            };
            let name: String = line[at + "const ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A declaration (a `u16` constant named so), not a mention.
            if !line[at..].contains(": u16") {
                continue;
            }
            if !EXTRAS.iter().any(|(extra, _)| *extra == name) {
                found.push(format!("{name} in {}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "ext keys that are not listed extras (a money or lease term is a typed field of a \
         new message version; an optional extra is listed in this test with why): {found:#?}"
    );
}
