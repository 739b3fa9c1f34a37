//! MIG slices as units, with real processes and Docker: a host whose fake driver has MIG on
//! offers its A100 whole and its two 1g.10gb slices apart. A lease on a slice gets exactly
//! that slice (the one the driver names, in the container), at a seventh of the GPU's price;
//! while it runs the whole GPU is neither offered nor leasable, and the other slice is.

use super::market::{Market, wait_for};

const GPU: &str = "GPU-a1000000-0000-4000-8000-000000000001";
const SLICES: [&str; 2] = [
    "MIG-a1000000-0000-4000-8000-0000000000a1",
    "MIG-a1000000-0000-4000-8000-0000000000a2",
];

fn driver_config() -> String {
    format!(
        "[[gpu]]\nname = \"NVIDIA A100-SXM4-80GB\"\nuuid = \"{GPU}\"\n\
         memory_total_bytes = 85899345920\ncompute_capability = [8, 0]\n\
         mig_enabled = true\nmig = [\n\
         {{ uuid = \"{}\", profile = \"1g.10gb\", memory_total_bytes = 10468982784 }},\n\
         {{ uuid = \"{}\", profile = \"1g.10gb\", memory_total_bytes = 10468982784 }},\n]\n",
        SLICES[0], SLICES[1]
    )
}

#[test]
fn a_slice_lease_gets_exactly_its_slice_and_keeps_the_whole_gpu_out() {
    let mut market = Market::start(0, 0, 10);
    market.add_host_config(&driver_config());
    market.add_renter(&[]);
    let renter = &market.renters[0];
    let hits = |query: &str| renter.api().offers(query, 10).unwrap();
    wait_for("the GPU and its slices offered apart", 30, || {
        hits("gpu=a100").len() == 2
    });
    let slices = hits("mig=true");
    assert_eq!(slices.len(), 1, "{slices:?}");
    assert_eq!(slices[0].mig_profile.as_deref(), Some("1g.10gb"));
    assert_eq!((slices[0].vram_gb, slices[0].gpus), (10, 2));
    // A seventh of the whole GPU's 3.60 credits per hour.
    assert_eq!(slices[0].price_per_gpu_hour.0, 3_600_000 / 7);

    let rent = |query: &str| {
        market.rent_output(
            renter,
            query,
            &["--max-price", "5", "--duration", "40"],
            "echo devices=$GPUX_DEVICES; sleep 30",
        )
    };
    let out = rent("gpu=a100 mig=true");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first.gpus.len(), 1);
    let slice = first.gpus[0].clone();
    assert!(SLICES.contains(&slice.as_str()), "{slice}");
    // The container is given that slice and nothing else (fake GPUs: named in GPUX_DEVICES,
    // as a real host names it in the device request; see the executor's spec tests).
    wait_for("the slice's work to run", 30, || {
        renter
            .api()
            .logs(&first.lease, 0)
            .is_ok_and(|p| p.text.contains(&format!("devices={slice}\n")))
    });

    // The whole GPU leaves the market at the next publication; the other slice stays.
    wait_for("the whole GPU withdrawn", 20, || {
        hits("gpu=a100 mig=false").iter().all(|h| h.free == 0)
    });
    let out = rent("gpu=a100 mig=false");
    assert!(
        !out.status.success(),
        "the GPU of a leased slice was leased"
    );
    let out = rent("gpu=a100 mig=true");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(second.gpus.len(), 1);
    assert_ne!(second.gpus[0], slice);
    assert!(SLICES.contains(&second.gpus[0].as_str()));

    // Both stopped: the whole GPU is offered again.
    for lease in [&first.lease, &second.lease] {
        let out = renter.gpux(&["stop", lease]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_for("the whole GPU offered again", 30, || {
        hits("gpu=a100 mig=false").iter().any(|h| h.free == 1)
    });
    market.assert_conserved();
}
