//! A GPU and its MIG instances are one piece of hardware: the host's book never leases both
//! at once, and its offers leave out whichever shares hardware with a leased device.

use gpux_lease::{Answer, HostBook, Timing};
use gpux_protocol::*;
use gpux_testkit as kit;

use crate::rules::{T0, host, request_by};

const GPU: GpuUuid = GpuUuid::Gpu([3; 16]);
const SLICE_A: GpuUuid = GpuUuid::Mig([0xa1; 16]);
const SLICE_B: GpuUuid = GpuUuid::Mig([0xa2; 16]);

fn offer(slot: u16, gpus: &[GpuUuid], profile: Option<&str>) -> Verified<Offer> {
    kit::sign(
        &host(),
        Offer {
            seq: u64::from(slot) + 1,
            slot,
            spot_floor_per_gpu_hour: Some(MicroCredits(1_000_000)),
            terms: OfferTerms {
                mig_profile: profile.map(|p| BoundedString::new(p).unwrap()),
                ..OfferTerms::default()
            },
            ..kit::offer(Timestamp(T0), gpus.iter().map(|&uuid| kit::a100(uuid)))
        },
    )
}

fn request(
    offer: &Verified<Offer>,
    gpu: GpuUuid,
    kind: LeaseKind,
    n: u8,
) -> Verified<LeaseRequest> {
    request_by(&Keypair::from_seed(&[n; 32]), offer, gpu, T0, kind)
}

fn book() -> (HostBook, Verified<Offer>, Verified<Offer>) {
    let mut book = HostBook::new(host(), Timing::default());
    book.set_mig_layout([(GPU, SLICE_A), (GPU, SLICE_B)]);
    let whole = offer(0, &[GPU], None);
    let slices = offer(1, &[SLICE_A, SLICE_B], Some("1g.10gb"));
    book.add_offer(whole.clone(), Timestamp(T0));
    book.add_offer(slices.clone(), Timestamp(T0));
    (book, whole, slices)
}

fn answer(book: &mut HostBook, r: Verified<LeaseRequest>) -> Result<ContentId, RejectReason> {
    let id = r.id();
    match book.handle_request(r, Timestamp(T0), false) {
        Answer::Accepted { .. } => Ok(id),
        Answer::Rejected { reason, .. } => Err(reason),
    }
}

#[test]
fn a_leased_slice_keeps_its_gpu_out_and_a_leased_gpu_its_slices() {
    let now = Timestamp(T0 + 1);
    // A slice leased: its GPU is neither offered nor leasable; the other slice is both.
    let (mut b, whole, slices) = book();
    let a = answer(&mut b, request(&slices, SLICE_A, LeaseKind::OnDemand, 11)).unwrap();
    assert_eq!(
        answer(&mut b, request(&whole, GPU, LeaseKind::OnDemand, 12)),
        Err(RejectReason::GpusUnavailable)
    );
    let out = b.unoffered_gpus(now);
    assert!(out.contains(&SLICE_A) && out.contains(&GPU), "{out:?}");
    assert!(!out.contains(&SLICE_B), "{out:?}");
    assert!(b.busy_gpus(now).contains(&GPU));
    answer(&mut b, request(&slices, SLICE_B, LeaseKind::OnDemand, 13)).unwrap();
    // Once the slice's lease ends, the GPU is free to lease again (with the other slice
    // released too).
    b.release(&a);
    assert_eq!(
        answer(&mut b, request(&whole, GPU, LeaseKind::OnDemand, 14)),
        Err(RejectReason::GpusUnavailable),
        "slice B still runs"
    );

    // The whole GPU leased: no slice is offered or leasable, even a spot lease on it does
    // not let an on-demand slice preempt across (one is never cut for the other).
    let (mut b, whole, slices) = book();
    answer(&mut b, request(&whole, GPU, LeaseKind::Spot, 15)).unwrap();
    let out = b.unoffered_gpus(now);
    assert!(out.contains(&SLICE_A) && out.contains(&SLICE_B), "{out:?}");
    assert!(
        !out.contains(&GPU),
        "a spot lease's GPU stays offered: {out:?}"
    );
    for (slice, n) in [(SLICE_A, 16), (SLICE_B, 17)] {
        assert_eq!(
            answer(&mut b, request(&slices, slice, LeaseKind::OnDemand, n)),
            Err(RejectReason::GpusUnavailable)
        );
    }

    // A window booked ahead on a slice is listed on its GPU as well.
    let (mut b, _, slices) = book();
    let start = Timestamp(T0 + 60_000);
    let end = Timestamp(T0 + 180_000);
    answer(
        &mut b,
        request(&slices, SLICE_A, LeaseKind::Reserved { start, end }, 18),
    )
    .unwrap();
    assert_eq!(b.booked_ahead(&GPU, now), vec![(start, end)]);
    assert!(b.booked_ahead(&SLICE_B, now).is_empty());
}
