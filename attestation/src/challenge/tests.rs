use super::*;

/// A reference any machine beats, for correctness-only tests.
const FAST: Timed = Timed {
    observed: Duration::from_millis(1),
    reference: 1e-6,
};

fn shape(m: u32, k: u32, n: u32) -> Shape {
    Shape::new(m, k, n).unwrap()
}

fn seed(i: u64) -> [u8; 32] {
    *blake3::hash(&i.to_le_bytes()).as_bytes()
}

fn check(
    seed: &[u8; 32],
    c: &Committed,
    opened: &[Opened],
    coins: &[u8; 32],
) -> Result<Verdict, ChallengeError> {
    verify(
        seed,
        c.shape,
        &c.root,
        opened,
        FAST,
        &Policy::default(),
        coins,
    )
}

#[test]
fn the_product_is_the_definition_and_never_overflows() {
    let s = shape(64, 128, 64);
    let sd = seed(1);
    let c = prove_cpu(&sd, s);
    let key_a = tensor::key(&sd, s, tensor::Which::A);
    let b = tensor::b_matrix(tensor::key(&sd, s, tensor::Which::B), s);
    for o in c.open(&[0, 17, 63]) {
        let a = tensor::a_row(key_a, s, o.index);
        for j in 0..64 {
            let want: i64 = (0..128)
                .map(|kk| i64::from(a[kk]) * i64::from(b[kk * 64 + j]))
                .sum();
            assert_eq!(i64::from(o.row[j]), want, "row {} col {j}", o.index);
        }
    }
    // The extreme: every entry -128 over the longest sum fits i32.
    let k = MAX_CHALLENGE_K as usize;
    let a = vec![-128i8; k];
    let b = vec![-128i8; k];
    let mut out = [0i32; 1];
    tensor::c_row(&a, &b, 1, &mut out);
    assert_eq!(i64::from(out[0]), 16_384 * k as i64);
    // Entries cover the whole i8 range and depend on the seed, the matrix and the shape.
    let mut row = vec![0i8; 4096];
    tensor::fill(key_a, 0, &mut row);
    assert!(row.contains(&-128) && row.contains(&127));
    assert_ne!(key_a, tensor::key(&sd, s, tensor::Which::B));
    assert_ne!(key_a, tensor::key(&seed(2), s, tensor::Which::A));
    assert_ne!(
        key_a,
        tensor::key(&sd, shape(128, 128, 64), tensor::Which::A)
    );
}

#[test]
fn an_honest_prover_passes_and_a_slow_one_does_not() {
    let sd = seed(3);
    let c = prove_cpu(&sd, shape(256, 128, 64));
    let coins = seed(4);
    let picked = pick_rows(&coins, 256, &Policy::default());
    assert_eq!(picked.len(), 128);
    assert!(picked.windows(2).all(|w| w[0] < w[1]));
    check(&sd, &c, &c.open(&picked), &coins).unwrap();
    // Every row when there are fewer than the policy's.
    let small = prove_cpu(&sd, shape(64, 64, 64));
    assert_eq!(
        pick_rows(&coins, 64, &Policy::default()),
        (0..64).collect::<Vec<_>>()
    );
    check(
        &sd,
        &small,
        &small.open(&(0..64).collect::<Vec<_>>()),
        &coins,
    )
    .unwrap();
    let slow = verify(
        &sd,
        c.shape,
        &c.root,
        &c.open(&picked),
        Timed {
            observed: Duration::from_secs(1),
            reference: 1000.0,
        },
        &Policy::default(),
        &coins,
    );
    assert!(
        matches!(slow, Err(ChallengeError::TooSlow { .. })),
        "{slow:?}"
    );
}

#[test]
fn a_prover_that_skipped_a_tenth_of_the_rows_is_caught_in_999_of_1000_runs() {
    let s = shape(1024, 64, 64);
    let mut caught = 0;
    for run in 0..1000u64 {
        let sd = seed(run);
        let mut c = prove_cpu(&sd, s);
        // A seeded tenth of the rows never computed: committed as zeros.
        let mut skipped = std::collections::BTreeSet::new();
        let mut draws = blake3::Hasher::new_keyed(&sd).finalize_xof();
        while skipped.len() < 102 {
            let mut b = [0u8; 4];
            draws.fill(&mut b);
            skipped.insert(u32::from_le_bytes(b) % 1024);
        }
        let skipped: Vec<u32> = skipped.into_iter().collect();
        c.forge(&skipped, |row| row.fill(0));
        let coins = seed(run + 1_000_000);
        let picked = pick_rows(&coins, s.m, &Policy::default());
        match check(&sd, &c, &c.open(&picked), &coins) {
            Err(ChallengeError::WrongRow { row }) => {
                assert!(skipped.contains(&row));
                caught += 1;
            }
            Ok(_) => {}
            Err(e) => panic!("run {run}: {e}"),
        }
    }
    assert!(caught >= 999, "caught {caught} of 1000");
    assert!(Policy::default().pass_bound(0.1) < 2e-6);
}

#[test]
fn a_wrong_row_answered_is_caught_every_time() {
    let s = shape(256, 64, 64);
    let sd = seed(7);
    let honest = prove_cpu(&sd, s);
    for run in 0..1000u64 {
        let coins = seed(run + 5000);
        let picked = pick_rows(&coins, s.m, &Policy::default());
        let target = picked[(run as usize) % picked.len()];
        // Committed honestly, then a different row answered: the root refuses it.
        let mut opened = honest.open(&picked);
        let at = picked.iter().position(|&i| i == target).unwrap();
        opened[at].row[(run % 64) as usize] += 1 + run as i32;
        assert_eq!(
            check(&sd, &honest, &opened, &coins),
            Err(ChallengeError::Commitment { row: target })
        );
        // Committed to the wrong value from the start: the projections refuse it.
        let mut forged = honest.clone();
        forged.forge(&[target], |row| row[(run % 64) as usize] -= 1);
        assert_eq!(
            check(&sd, &forged, &forged.open(&picked), &coins),
            Err(ChallengeError::WrongRow { row: target }),
            "run {run}"
        );
    }
}

#[test]
fn rows_not_picked_or_out_of_order_are_refused() {
    let sd = seed(9);
    let c = prove_cpu(&sd, shape(512, 64, 64));
    let coins = seed(10);
    let picked = pick_rows(&coins, 512, &Policy::default());
    let mut other: Vec<u32> = picked.iter().map(|i| (i + 1) % 512).collect();
    other.sort_unstable();
    assert!(matches!(
        check(&sd, &c, &c.open(&other), &coins),
        Err(ChallengeError::Unopened { .. })
    ));
    let mut fewer = c.open(&picked);
    fewer.pop();
    assert!(matches!(
        check(&sd, &c, &fewer, &coins),
        Err(ChallengeError::Unopened { .. })
    ));
    // The right rows for another seed.
    let wrong_seed = prove_cpu(&seed(11), c.shape);
    let opened = wrong_seed.open(&picked);
    assert!(matches!(
        verify(
            &sd,
            c.shape,
            &wrong_seed.root,
            &opened,
            FAST,
            &Policy::default(),
            &coins
        ),
        Err(ChallengeError::WrongRow { .. })
    ));
}

#[test]
fn a_second_of_an_h100_downloads_under_8_mib() {
    let h100 = crate::spec::spec_for_name("NVIDIA H100 80GB HBM3").unwrap();
    let s = shape_for(h100.challenge_gops, Duration::from_secs(1));
    assert!(s.operations() >= h100.challenge_gops * 1e9, "{s}");
    assert!(Shape::new(s.m, s.k, s.n).is_ok(), "{s}");
    let bytes = s.opened_bytes(Policy::default().rows);
    assert!(bytes <= 8 << 20, "{s}: {bytes} bytes");
    // A CPU's rate gets a small shape.
    let cpu = shape_for(0.5, Duration::from_millis(40));
    assert_eq!((cpu.m, cpu.k, cpu.n), (64, 1024, 256));
    assert!(Shape::new(0, 64, 64).is_err() && Shape::new(64, 65, 64).is_err());
}
