//! One deterministic sample of every message kind, with optional fields filled so that the
//! golden bytes cover as much of each encoding as possible.

use gpux_protocol::*;

pub const T0: Timestamp = Timestamp(1_764_460_800_000);

pub fn host() -> Keypair {
    Keypair::from_seed(&[7; 32])
}
pub fn renter() -> Keypair {
    Keypair::from_seed(&[8; 32])
}
pub fn ledger() -> Keypair {
    Keypair::from_seed(&[9; 32])
}

pub fn uuid(n: u8) -> GpuUuid {
    GpuUuid::Gpu([n; 16])
}

pub fn image() -> ImageDigest {
    ImageDigest([0xd1; 32])
}

fn s<const N: usize>(text: &str) -> BoundedString<N> {
    BoundedString::new(text).unwrap()
}

fn ext_with_field() -> Ext {
    let mut ext = Ext::new();
    ext.insert(7, vec![1, 2, 3]).unwrap();
    ext
}

pub fn gpu_facts(index: u32, name: &str, memory: u64, cc: (u8, u8)) -> GpuFacts {
    GpuFacts {
        index,
        name: s(name),
        uuid: uuid(index as u8 + 1),
        serial: Some(s("1654922000123")),
        board_part_number: Some(s("900-21010-0000-000")),
        memory_total_bytes: memory,
        compute_capability: ComputeCapability::new(cc.0, cc.1),
        pcie: PcieFacts {
            max_gen: Some(5),
            max_width: Some(16),
            current_gen: Some(5),
            current_width: Some(16),
        },
        power_limit_mw: Some(700_000),
        max_sm_clock_mhz: Some(1980),
        max_memory_clock_mhz: Some(2619),
        ecc: Some(EccFacts {
            enabled: true,
            corrected_total: Some(0),
            uncorrected_total: None,
        }),
        mig: Some(MigFacts {
            enabled: false,
            instances: BoundedVec::empty(),
        }),
        confidential_compute: None,
    }
}

pub fn attestation() -> Attestation {
    let mib = 1u64 << 20;
    Attestation {
        created_at: T0,
        driver_version: s("550.54.15"),
        cuda_driver_version: Some(Version::new(12, 4, 0)),
        nvml_version: s("12.550.54.15"),
        gpus: BoundedVec::new(vec![
            gpu_facts(0, "NVIDIA H100 80GB HBM3", 81_559 * mib, (9, 0)),
            GpuFacts {
                // MIG on, two slices: pins the encoding of MIG devices.
                mig: Some(MigFacts {
                    enabled: true,
                    instances: BoundedVec::new(vec![
                        MigInstance {
                            uuid: GpuUuid::Mig([0xa1; 16]),
                            profile: s("1g.10gb"),
                            memory_total_bytes: 9_984 * mib,
                        },
                        MigInstance {
                            uuid: GpuUuid::Mig([0xa2; 16]),
                            profile: s("3g.40gb"),
                            memory_total_bytes: 40_192 * mib,
                        },
                    ])
                    .unwrap(),
                }),
                ..gpu_facts(1, "NVIDIA H100 80GB HBM3", 81_559 * mib, (9, 0))
            },
        ])
        .unwrap(),
        ext: Ext::new(),
    }
}

pub fn offer_for(att: &Verified<Attestation>, seq: u64) -> Offer {
    Offer {
        seq,
        slot: 0,
        created_at: T0,
        expires_at: T0.plus_secs(600),
        attestation: att.id(),
        gpus: BoundedVec::new(
            att.gpus
                .iter()
                .map(|g| OfferGpu {
                    uuid: g.uuid,
                    family: s(GpuFamily::classify(&g.name).key()),
                    memory_bytes: g.memory_total_bytes,
                    compute_capability: g.compute_capability,
                    pcie_gen: g.pcie.max_gen.unwrap_or(0),
                })
                .collect(),
        )
        .unwrap(),
        price_per_gpu_hour: "2.10".parse().unwrap(),
        spot_floor_per_gpu_hour: Some("0.90".parse().unwrap()),
        min_duration_s: 60,
        max_duration_s: 86_400,
        region: s("eu-west"),
        tier: EvidenceTier::SelfReported,
        driver: Version::new(550, 54, 15),
        cuda: Version::new(12, 4, 0),
        images: BoundedVec::new(vec![image()]).unwrap(),
        machine: machine(),
        pulls: pulls(),
        // Terms that leave the sample request valid against it: free workspaces, a window
        // booked two days ahead, a cancellation schedule (tags: `protocol` unit tests).
        terms: OfferTerms {
            workspace_bytes: 100 << 30,
            max_retain_s: Some(3600),
            max_image_bytes: 0,
            workspace_price: MicroCredits::ZERO,
            image_tags: BoundedVec::empty(),
            booked: BoundedVec::new(vec![BookedWindow {
                gpu: 0,
                start: T0.plus_secs(2 * 86_400),
                end: T0.plus_secs(2 * 86_400 + 3600),
            }])
            .unwrap(),
            mig_profile: None,
            cancel_fees: "1h:50%,10m:100%".parse().unwrap(),
        },
        ext: Ext::new(),
    }
}

/// A host that pulls images of up to 40 GiB from three registries in 30 minutes, with 16
/// images cached (an offer of its two GPUs stays under 1 KiB).
pub fn pulls() -> Pulls {
    let cached = [
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-devel",
        "vllm/vllm-openai:v0.6.4",
        "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
        "nvcr.io/nvidia/pytorch:24.10-py3",
        "tensorflow/tensorflow:2.18.0-gpu",
        "huggingface/transformers-pytorch-gpu:4.41.2",
        "ghcr.io/huggingface/text-generation-inference:2.4",
        "jupyter/pytorch-notebook:cuda12-2024-10-07",
        "python:3.12-slim",
        "ubuntu:24.04",
        "rocker/ml-verse:4.4",
        "ollama/ollama:0.4.2",
        "nvidia/cuda:12.6.2-devel-ubuntu24.04",
        "lmsysorg/sglang:v0.3.6-cu124",
        "ghcr.io/ggerganov/llama.cpp:server-cuda",
    ];
    Pulls {
        max_bytes: 40 << 30,
        timeout_s: 1800,
        registries: BoundedVec::new(
            ["docker.io", "ghcr.io", "nvcr.io", "!registry.evil.example"]
                .into_iter()
                .map(s)
                .collect(),
        )
        .unwrap(),
        cached: BoundedVec::new(cached.into_iter().map(s).collect()).unwrap(),
    }
}

/// A two-GPU machine's facts: 52 of its 56 threads and 480 GiB of its memory go to leases,
/// split over the two GPUs.
pub fn machine() -> Machine {
    Machine {
        cpu_model: s("Intel(R) Xeon(R) Platinum 8480+"),
        cpu_threads: 52,
        memory_bytes: 480 << 30,
        disk_write_mbps: 2_100,
        net_up_mbps: 940,
        net_down_mbps: 9_400,
        share: Share {
            cpu_millis: 26_000,
            memory_bytes: 240 << 30,
        },
    }
}

pub fn lease_request_for(offer: &Verified<Offer>) -> LeaseRequest {
    LeaseRequest {
        created_at: T0.plus_secs(1),
        expires_at: T0.plus_secs(31),
        offer: offer.id(),
        host: offer.signer(),
        gpus: BoundedVec::new(vec![offer.gpus[0].uuid]).unwrap(),
        price_per_gpu_hour: offer.price_per_gpu_hour,
        duration_s: 3600,
        kind: LeaseKind::OnDemand,
        image: image(),
        command: BoundedVec::new(vec![s("/bin/sh"), s("-c"), s("echo hello")]).unwrap(),
        env: BoundedVec::new(vec![EnvVar {
            name: s("BATCH_SIZE"),
            value: s("64"),
        }])
        .unwrap(),
        limits: ResourceLimits {
            memory_bytes: 8 << 30,
            cpu_millis: 4000,
            pids: 512,
            scratch_bytes: 1 << 30,
            shm_bytes: 1 << 30,
        },
        network: false,
        escrow: EscrowId([0xe5; 16]),
        escrow_amount: "2.10".parse().unwrap(),
        bid: None,
        ssh_keys: BoundedVec::new(vec![s(
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx8w3Dq7V2kzq9mYlQbq1oGm0ZfS1x9hQ3s4h0rZs9b renter@laptop",
        )])
        .unwrap(),
        // Terms that cost nothing more, so the sample's escrow covers them: a workspace kept
        // free of charge, a commit wait and a group.
        terms: LeaseTerms {
            workspace_bytes: Some(10 << 30),
            retain_s: Some(600),
            cache_image: false,
            workspace_price: MicroCredits::ZERO,
            commit_wait_ms: Some(60_000),
            group: Some([0x6e; 16]),
            committed_s: 0,
            cancel_fees: CancelFees::default(),
        },
        ext: Ext::new(),
    }
}

pub fn receipt_for(request: &Verified<LeaseRequest>, seq: u64, gpu_seconds: u64) -> UsageReceipt {
    UsageReceipt {
        lease: request.id(),
        escrow: request.escrow,
        price_per_gpu_hour: request.price_per_gpu_hour,
        gpus: request.gpus.len() as u16,
        seq,
        created_at: T0.plus_secs(1 + gpu_seconds),
        gpu_seconds,
        amount_due: money::cost(gpu_seconds, request.price_per_gpu_hour).unwrap(),
        workspace_charge: MicroCredits::ZERO,
        usage: UsageSummary {
            gpu_util_permille: 873,
            gpu_memory_peak_bytes: 40 << 30,
            memory_peak_bytes: 3 << 30,
            cpu_millis_avg: 1200,
        },
        ext: Ext::new(),
    }
}

pub fn ack_for(receipt: &Verified<UsageReceipt>) -> ReceiptAck {
    ReceiptAck {
        receipt: receipt.id(),
        lease: receipt.lease,
        seq: receipt.seq,
        amount_due: receipt.amount_due,
        created_at: receipt.created_at.plus_ms(50),
        ext: Ext::new(),
    }
}

pub fn bid() -> Bid {
    Bid {
        seq: 3,
        slot: 2,
        created_at: T0,
        expires_at: T0.plus_secs(300),
        query: s("gpu=H100 vram>=80 region=eu"),
        gpus: 2,
        max_price_per_gpu_hour: "2.50".parse().unwrap(),
        duration_s: 7200,
        kind: LeaseKind::Reserved {
            start: T0.plus_secs(3600),
            end: T0.plus_secs(3600 + 7200),
        },
        allow_spread: false,
        ext: ext_with_field(),
    }
}

/// Every kind, signed, in kind-code order.
pub fn all_signed() -> Vec<(MessageKind, Vec<u8>)> {
    let (h, r, l) = (host(), renter(), ledger());
    let att = Signed::sign(&h, attestation()).unwrap();
    let offer = Signed::sign(&h, offer_for(&att, 1)).unwrap();
    let request = Signed::sign(&r, lease_request_for(&offer)).unwrap();
    let receipt = Signed::sign(&h, receipt_for(&request, 1, 60)).unwrap();
    let ack = Signed::sign(&r, ack_for(&receipt)).unwrap();
    let lease = request.id();
    let escrow = request.escrow;
    let mut all: Vec<(MessageKind, Vec<u8>)> = vec![
        (MessageKind::Attestation, att.as_bytes().to_vec()),
        (MessageKind::Offer, offer.as_bytes().to_vec()),
    ];
    let mut add = |kind, bytes: &[u8]| all.push((kind, bytes.to_vec()));
    add(
        MessageKind::OfferWithdrawal,
        Signed::sign(
            &h,
            OfferWithdrawal {
                seq: 2,
                created_at: T0.plus_secs(5),
                offer: offer.id(),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::Bid,
        Signed::sign(&r, bid()).unwrap().as_bytes(),
    );
    add(MessageKind::LeaseRequest, request.as_bytes());
    add(
        MessageKind::LeaseAccept,
        Signed::sign(
            &h,
            LeaseAccept {
                request: lease,
                created_at: T0.plus_secs(2),
                receipt_interval_ms: 60_000,
                ack_grace_ms: 30_000,
                spot_notice_ms: 30_000,
                starts_at: Some(T0.plus_secs(40)),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::LeaseReject,
        Signed::sign(
            &h,
            LeaseReject {
                request: lease,
                created_at: T0.plus_secs(2),
                reason: RejectReason::GpusUnavailable,
                detail: s("GPU-07 is leased until 12:00"),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::LeaseEnd,
        Signed::sign(
            &r,
            LeaseEnd {
                lease,
                created_at: T0.plus_secs(90),
                reason: EndReason::ContainerExited,
                exit_code: Some(0),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::PreemptionNotice,
        Signed::sign(
            &h,
            PreemptionNotice {
                lease,
                created_at: T0.plus_secs(30),
                ends_at: T0.plus_secs(150),
                preemptor: BoundedBytes::new(request.as_bytes().to_vec()).unwrap(),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(MessageKind::UsageReceipt, receipt.as_bytes());
    add(MessageKind::ReceiptAck, ack.as_bytes());
    let challenge = Signed::sign(
        &r,
        ChallengeRequest {
            host: h.public(),
            created_at: T0,
            seed: [0x5e; 32],
            m: 128,
            k: 1024,
            n: 256,
            fill_lanes: 8,
            fill_blocks: 1024,
            gpu: Some(uuid(1)),
            ext: Ext::new(),
        },
    )
    .unwrap();
    add(MessageKind::ChallengeRequest, challenge.as_bytes());
    add(
        MessageKind::ChallengeResponse,
        Signed::sign(
            &h,
            ChallengeResponse {
                request: challenge.id(),
                created_at: T0.plus_secs(1),
                rows_root: ContentId([0xaa; 32]),
                fill_root: Some(ContentId([0xbb; 32])),
                elapsed_ns: 1_234_567,
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::LogChunk,
        Signed::sign(
            &h,
            LogChunk {
                lease,
                seq: 0,
                created_at: T0.plus_secs(3),
                stream: LogStream::Stdout,
                data: BoundedBytes::new(b"hello\n".to_vec()).unwrap(),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::EscrowLock,
        Signed::sign(
            &r,
            EscrowLock {
                escrow,
                lease,
                payer: r.public(),
                payee: h.public(),
                amount: "2.10".parse().unwrap(),
                price_per_gpu_hour: "2.10".parse().unwrap(),
                created_at: T0.plus_secs(2),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::Redeem,
        Signed::sign(
            &h,
            Redeem {
                escrow,
                lease,
                receipt: BoundedBytes::new(receipt.as_bytes().to_vec()).unwrap(),
                ack: BoundedBytes::new(ack.as_bytes().to_vec()).unwrap(),
                created_at: T0.plus_secs(70),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::Release,
        Signed::sign(
            &r,
            Release {
                escrow,
                lease,
                created_at: T0.plus_secs(95),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    add(
        MessageKind::LedgerRecord,
        Signed::sign(
            &l,
            LedgerRecord {
                seq: 42,
                created_at: T0.plus_secs(71),
                op: ContentId([0x0b; 32]),
                escrow,
                entry: LedgerEntry::Redeemed {
                    payee: h.public(),
                    amount: MicroCredits(35_000),
                    cumulative: MicroCredits(35_000),
                    receipt_seq: 1,
                },
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes(),
    );
    let locked = Signed::sign(
        &l,
        LedgerRecord {
            seq: 41,
            created_at: T0.plus_secs(2),
            op: ContentId([0x0a; 32]),
            escrow,
            entry: LedgerEntry::Locked {
                payer: r.public(),
                payee: h.public(),
                amount: MicroCredits(300_000),
            },
            ext: Ext::new(),
        },
    )
    .unwrap();
    let paid = of(&all, MessageKind::LedgerRecord);
    let response = of(&all, MessageKind::ChallengeResponse);
    let result = (
        MessageKind::ChallengeResult,
        Signed::sign(
            &r,
            ChallengeResult {
                host: h.public(),
                attestation: att.id(),
                request: BoundedBytes::new(challenge.as_bytes().to_vec()).unwrap(),
                response: BoundedBytes::new(response).unwrap(),
                verdict: ChallengeVerdict::Passed {
                    speed_permille: 962,
                },
                locked: BoundedBytes::new(locked.as_bytes().to_vec()).unwrap(),
                paid: BoundedBytes::new(paid).unwrap(),
                created_at: T0.plus_secs(100),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes()
        .to_vec(),
    );
    all.push(result);
    let commit = (
        MessageKind::LeaseCommit,
        Signed::sign(
            &r,
            LeaseCommit {
                lease: ContentId::of(&of(&all, MessageKind::LeaseRequest)),
                created_at: T0.plus_secs(3),
                ext: ext_with_field(),
            },
        )
        .unwrap()
        .as_bytes()
        .to_vec(),
    );
    all.push(commit);
    // The faucet's grant (the sample ledger key stands for the faucet's).
    all.push((
        MessageKind::FaucetGrant,
        Signed::sign(
            &ledger(),
            FaucetGrant {
                account: r.public(),
                amount: MicroCredits(100_000_000),
                nonce: 7,
                created_at: T0.plus_secs(4),
                ext: ext_with_field(),
            },
        )
        .unwrap()
        .as_bytes()
        .to_vec(),
    ));
    // The renter withdraws its sample bid.
    let bid = Signed::sign(&r, bid()).unwrap();
    all.push((
        MessageKind::BidWithdrawal,
        Signed::sign(
            &r,
            BidWithdrawal {
                seq: 4,
                created_at: T0.plus_secs(5),
                bid: bid.id(),
                slot: 2,
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes()
        .to_vec(),
    ));
    all
}

fn of(all: &[(MessageKind, Vec<u8>)], kind: MessageKind) -> Vec<u8> {
    all.iter().find(|(k, _)| *k == kind).unwrap().1.clone()
}

/// One sample of each `/gpux/ledger/2` frame, named, with optional fields filled; the
/// submitted `Release` carries a voucher (the sample acknowledgement).
pub fn ledger_frames() -> Vec<(&'static str, Vec<u8>)> {
    use gpux_protocol::ledger_wire::{
        self, EscrowView, LedgerRequest, LedgerResponse, RefusalCode,
    };
    let signed = all_signed();
    let of = |kind| signed.iter().find(|(k, _)| *k == kind).unwrap().1.clone();
    let redeem = Signed::<Redeem>::from_bytes(of(MessageKind::Redeem))
        .unwrap()
        .verify()
        .unwrap();
    let release = Signed::<Release>::from_bytes(of(MessageKind::Release))
        .unwrap()
        .verify()
        .unwrap();
    let mut body = release.body().clone();
    body.set_voucher(&redeem.ack).unwrap();
    let with_voucher = Signed::sign(&renter(), body).unwrap();
    let escrow = release.escrow;
    vec![
        (
            "Submit(Release with voucher)",
            ledger_wire::encode(&LedgerRequest::Submit(with_voucher.as_bytes().to_vec())),
        ),
        (
            "Balance",
            ledger_wire::encode(&LedgerRequest::Balance(host().public())),
        ),
        (
            "Escrow",
            ledger_wire::encode(&LedgerRequest::Escrow(escrow)),
        ),
        (
            "Record",
            ledger_wire::encode(&LedgerResponse::Record(of(MessageKind::LedgerRecord))),
        ),
        (
            "Unchanged",
            ledger_wire::encode(&LedgerResponse::Unchanged("already released".into())),
        ),
        (
            "Balance answer",
            ledger_wire::encode(&LedgerResponse::Balance(1_250_000)),
        ),
        (
            "Escrow answer",
            ledger_wire::encode(&LedgerResponse::Escrow(Some(EscrowView {
                amount: 2_100_000,
                redeemed: 35_000,
                last_seq: 1,
                released: false,
                payer: renter().public(),
                payee: host().public(),
            }))),
        ),
        (
            "Refused(TooEarly)",
            ledger_wire::encode(&LedgerResponse::Refused {
                code: RefusalCode::TooEarly,
                detail: "the payer may release the escrow only after ...".into(),
                retry_at: Some(T0.plus_secs(700)),
            }),
        ),
        (
            "NotLeader",
            ledger_wire::encode(&LedgerResponse::NotLeader {
                leader: Some(ledger().peer_id().to_bytes().to_vec()),
                addrs: vec!["/ip4/10.0.0.3/tcp/4001".into()],
            }),
        ),
    ]
}
