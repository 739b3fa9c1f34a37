//! Minting through the API: a faucet's signed grant sent to the ledger, or, on a ledger
//! without a faucet, its operator's mint (a lone ledger node's, or a replicated ledger's
//! leader's).

use gpux_api::{ApiError, ErrorCode, Minted};
use gpux_protocol::MicroCredits;

use super::Daemon;
use crate::attest::now;

impl Daemon {
    pub(super) fn mint(&mut self, request: &gpux_api::MintRequest) -> Result<Minted, ApiError> {
        let (peer, amount) = mint_of(request)?;
        let service = self.ledger_service.as_mut().ok_or_else(|| {
            ApiError::new(ErrorCode::Conflict, "this node does not serve a ledger")
        })?;
        let balance = service
            .mint(peer.public_key(), amount, now())
            .map_err(|e| match e {
                crate::ledger::ServiceError::Refused { .. } => ApiError::bad_input(e.to_string()),
                _ => ApiError::internal(e.to_string()),
            })?;
        Ok(Minted {
            account: request.account.clone(),
            balance_micro: balance.0,
        })
    }

    /// Sends a faucet grant to the ledger: the one this node serves or is a member of, else
    /// the one it settles with (`--ledger`). Each member of a replicated ledger checks the
    /// faucet's signature; the record comes back co-signed by a majority.
    pub(super) fn mint_grant(
        &mut self,
        request: gpux_api::MintRequest,
        reply: tokio::sync::oneshot::Sender<Result<Minted, ApiError>>,
    ) {
        use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse};
        let checked = grant_of(&request).and_then(|envelope| Ok((envelope, mint_of(&request)?)));
        let (envelope, (peer, _)) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let account = peer.public_key();
        let frame = ledger_wire::encode(&LedgerRequest::Submit(envelope.clone()));
        let account_id = request.account.clone();
        let minted = move |balance: u64| Minted {
            account: account_id.clone(),
            balance_micro: balance,
        };
        // The answer of a ledger this node runs (a member answers only as the leader).
        let judge = |response: LedgerResponse| match response {
            LedgerResponse::Record(_)
            | LedgerResponse::Cosigned(_)
            | LedgerResponse::Unchanged(_) => Ok(()),
            LedgerResponse::NotLeader { .. } => Err(ApiError::new(
                ErrorCode::Conflict,
                "this member is not the ledger's leader",
            )
            .with_hint("mint on the leader (`gpux ledger status` says which)")),
            LedgerResponse::Refused { code, detail, .. } => Err(ApiError::bad_input(format!(
                "the ledger refused the grant: {code:?}: {detail}"
            ))),
            other => Err(ApiError::internal(format!("unexpected answer: {other:?}"))),
        };
        if let Some(service) = self.ledger_service.as_mut() {
            let result = judge(service.handle(&frame, now()))
                .map(|()| minted(service.ledger().balance(&account).0));
            let _ = reply.send(result);
            return;
        }
        if let Some(cluster) = self.ledger_cluster.clone() {
            tokio::spawn(async move {
                let result = judge(cluster.handle(&frame, now()).await)
                    .map(|()| minted(cluster.state().read(|m| m.ledger().balance(&account).0)));
                let _ = reply.send(result);
            });
            return;
        }
        let Some(ledger) = self.ledger.clone() else {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::Conflict,
                "this node has no ledger to send the grant to",
            )
            .with_hint("start it with --ledger ADDR")));
            return;
        };
        tokio::spawn(async move {
            let result = async {
                match ledger.submit(envelope).await {
                    gpux_lease::LedgerVerdict::Applied(_)
                    | gpux_lease::LedgerVerdict::Unchanged => {}
                    gpux_lease::LedgerVerdict::Refused { code, .. } => {
                        return Err(ApiError::bad_input(format!(
                            "the ledger refused the grant: {code:?}"
                        )));
                    }
                    gpux_lease::LedgerVerdict::Unreachable => {
                        return Err(ApiError::new(
                            ErrorCode::Unavailable,
                            "the ledger did not answer (or its record lacked a majority)",
                        ));
                    }
                }
                let balance = ledger
                    .balance(account)
                    .await
                    .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?;
                Ok(minted(balance.0))
            }
            .await;
            let _ = reply.send(result);
        });
    }

    /// Mints through the replicated ledger this node is a member of (its leader applies
    /// it; a follower answers with where the leader is).
    pub(super) fn mint_in_cluster(
        &self,
        request: gpux_api::MintRequest,
        reply: tokio::sync::oneshot::Sender<Result<Minted, ApiError>>,
    ) {
        let Some(cluster) = self.ledger_cluster.clone() else {
            return;
        };
        tokio::spawn(async move {
            let result = async {
                let (peer, amount) = mint_of(&request)?;
                let account = peer.public_key();
                match cluster.mint(account, amount, now()).await {
                    Ok(gpux_protocol::ledger_wire::LedgerResponse::Record(_)) => Ok(Minted {
                        account: request.account.clone(),
                        balance_micro: cluster.state().read(|m| m.ledger().balance(&account).0),
                    }),
                    Ok(other) => Err(ApiError::bad_input(format!("refused: {other:?}"))),
                    Err(crate::ledger::cluster::ClusterError::NotLeader) => Err(ApiError::new(
                        ErrorCode::Conflict,
                        "this member is not the ledger's leader",
                    )
                    .with_hint("mint on the leader (`gpux ledger status` says which)")),
                    Err(e) => Err(ApiError::internal(e.to_string())),
                }
            }
            .await;
            let _ = reply.send(result);
        });
    }
}

/// A faucet grant's envelope from a mint request, checked against the request's account
/// and amount (its signature is the ledger's to judge: only it knows its faucet).
fn grant_of(request: &gpux_api::MintRequest) -> Result<Vec<u8>, ApiError> {
    let (peer, amount) = mint_of(request)?;
    let envelope = gpux_protocol::unhex(request.grant.as_deref().unwrap_or_default().trim())
        .map_err(|e| ApiError::bad_input(format!("grant: not hex: {e}")))?;
    let grant = gpux_protocol::Signed::<gpux_protocol::FaucetGrant>::from_bytes(envelope.clone())
        .and_then(gpux_protocol::Signed::verify)
        .map_err(|e| ApiError::bad_input(format!("grant: {e}")))?;
    if grant.account != peer.public_key() || grant.amount != amount {
        return Err(ApiError::bad_input(
            "grant: it names another account or amount than the request",
        ));
    }
    Ok(envelope)
}

/// The account and amount of a mint request, checked.
fn mint_of(
    request: &gpux_api::MintRequest,
) -> Result<(gpux_protocol::PeerId, MicroCredits), ApiError> {
    let peer = request
        .account
        .parse::<gpux_protocol::PeerId>()
        .map_err(|e| ApiError::bad_input(format!("account: {e}")))?;
    let amount = request
        .amount
        .parse::<MicroCredits>()
        .map_err(|e| ApiError::bad_input(format!("amount: {e}")))?;
    if amount.0 == 0 {
        return Err(ApiError::bad_input("amount: must be more than zero"));
    }
    Ok((peer, amount))
}
