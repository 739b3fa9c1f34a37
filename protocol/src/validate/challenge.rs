//! The performance challenge's rules: a host's answer against the renter's request, and a
//! published challenge result against the ledger the caller trusts.

use super::{RuleError, same_id, same_signer};
use crate::envelope::{Message, Signed, Verified};
use crate::key::PublicKey;
use crate::messages::{ChallengeRequest, ChallengeResponse, ChallengeResult, LedgerEntry};

/// A challenge response against its request: from the challenged host, naming the request.
pub fn challenge_response_matches_request(
    response: &Verified<ChallengeResponse>,
    request: &Verified<ChallengeRequest>,
) -> Result<(), RuleError> {
    same_signer("the challenge response", request.host, response.signer())?;
    same_id("response.request", response.request, request.id())
}

/// A challenge result against the ledger the caller trusts: the challenger's own request
/// (its seed) for this host, the host's signed answer to it, and that ledger's records of an
/// escrow the challenger locked to the host and of a redemption from it, so the challenger
/// paid the host for a lease. It does not look at the verdict (a failed challenge is valid
/// evidence too; only a passed one earns the `challenged` tier). A record signed by another
/// ledger is [`RuleError::SignerMismatch`] with `what` = "the ledger record": the caller
/// cannot judge it, which is no fault of whoever relayed it.
pub fn challenge_result_holds(
    result: &Verified<ChallengeResult>,
    ledger: PublicKey,
) -> Result<(), RuleError> {
    let challenger = result.signer();
    if challenger == result.host {
        return Err(RuleError::Evidence {
            what: "challenger",
            why: "a host cannot challenge itself".into(),
        });
    }
    fn open<T: Message>(what: &'static str, bytes: &[u8]) -> Result<Verified<T>, RuleError> {
        Signed::<T>::from_bytes(bytes.to_vec())
            .and_then(Signed::verify)
            .map_err(|e| RuleError::Evidence {
                what,
                why: e.to_string(),
            })
    }
    let request: Verified<ChallengeRequest> = open("request", &result.request)?;
    same_signer("the challenge request", challenger, request.signer())?;
    if request.host != result.host {
        return Err(RuleError::ChallengeMismatch { field: "host" });
    }
    let response: Verified<ChallengeResponse> = open("response", &result.response)?;
    challenge_response_matches_request(&response, &request)?;
    let locked: Verified<crate::LedgerRecord> = open("locked record", &result.locked)?;
    let paid: Verified<crate::LedgerRecord> = open("paid record", &result.paid)?;
    same_signer("the ledger record", ledger, locked.signer())?;
    same_signer("the ledger record", ledger, paid.signer())?;
    let evidence = |what, why: &str| RuleError::Evidence {
        what,
        why: why.into(),
    };
    match locked.entry {
        LedgerEntry::Locked { payer, payee, .. } if payer == challenger && payee == result.host => {
        }
        _ => {
            return Err(evidence(
                "locked record",
                "not an escrow the challenger locked to this host",
            ));
        }
    }
    if paid.escrow != locked.escrow {
        return Err(evidence("paid record", "not from the locked escrow"));
    }
    match paid.entry {
        LedgerEntry::Redeemed {
            payee, cumulative, ..
        } if payee == result.host && cumulative.0 > 0 => {}
        _ => {
            return Err(evidence(
                "paid record",
                "not a redemption paid to this host",
            ));
        }
    }
    Ok(())
}
