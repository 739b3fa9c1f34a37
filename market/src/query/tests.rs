use gpux_protocol::{GpuFamily, Keypair};

use super::*;

fn ok(text: &str) -> Query {
    Query::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn fails(text: &str) -> QueryError {
    Query::parse(text).expect_err(text)
}

fn one(text: &str) -> Clause {
    let q = ok(text);
    assert_eq!(q.clauses.len(), 1, "{text}");
    q.clauses.into_iter().next().unwrap()
}

#[test]
fn the_issue_example_parses() {
    let q =
        ok("gpu=H100 vram>=80 count>=2 price<=2.5 region=eu cc>=9.0 tier>=challenged spot=false");
    let fields: Vec<Field> = q.clauses.iter().map(|c| c.field).collect();
    assert_eq!(
        fields,
        [
            Field::Gpu,
            Field::Vram,
            Field::Count,
            Field::Price,
            Field::Region,
            Field::Cc,
            Field::Tier,
            Field::Spot
        ]
    );
    assert_eq!(q.clauses[0].values, [Value::Family(GpuFamily::H100)]);
    assert_eq!(q.clauses[3].values, [Value::Number(2_500_000)]);
    assert_eq!(q.clauses[5].values, [Value::Number(900)]);
    assert_eq!(q.clauses[6].values, [Value::Number(1)]);
    assert_eq!(q.clauses[7].values, [Value::Bool(false)]);
    assert_eq!(q.clauses[1].column, 10);
}

#[test]
fn every_operator() {
    for (text, op) in [
        ("vram=80", CompareOp::Eq),
        ("vram!=80", CompareOp::Ne),
        ("vram<80", CompareOp::Lt),
        ("vram<=80", CompareOp::Le),
        ("vram>80", CompareOp::Gt),
        ("vram>=80", CompareOp::Ge),
        ("vram in [40,80]", CompareOp::In),
        ("vram notin [40, 80]", CompareOp::NotIn),
        ("vram IN [40,80]", CompareOp::In),
        ("vram >= 80", CompareOp::Ge),
    ] {
        assert_eq!(one(text).op, op, "{text}");
    }
    assert_eq!(
        one("vram in [40,80]").values,
        [Value::Number(40), Value::Number(80)]
    );
}

#[test]
fn every_field_parses_its_values() {
    let host = Keypair::from_seed(&[3; 32]);
    let cases: Vec<(String, Field, Value)> = vec![
        (
            "gpu=h100".into(),
            Field::Gpu,
            Value::Family(GpuFamily::H100),
        ),
        ("GPU=a10g".into(), Field::Gpu, Value::Family(GpuFamily::A10)),
        ("vram=24".into(), Field::Vram, Value::Number(24)),
        ("count=8".into(), Field::Count, Value::Number(8)),
        ("price=0.000001".into(), Field::Price, Value::Number(1)),
        ("cc=8.6".into(), Field::Cc, Value::Number(806)),
        ("pcie_gen=5".into(), Field::PcieGen, Value::Number(5)),
        (
            "region=EU-West".into(),
            Field::Region,
            Value::Region("eu-west".into()),
        ),
        (
            "reliability=0.95".into(),
            Field::Reliability,
            Value::Number(950),
        ),
        ("tier=cc-attested".into(), Field::Tier, Value::Number(2)),
        ("spot=yes".into(), Field::Spot, Value::Bool(true)),
        ("mig=true".into(), Field::Mig, Value::Bool(true)),
        (
            format!("host={}", host.peer_id()),
            Field::Host,
            Value::Host(host.public()),
        ),
        (
            format!("host={}", host.public()),
            Field::Host,
            Value::Host(host.public()),
        ),
        (
            "driver=550.54.15".into(),
            Field::Driver,
            Value::Number((550 << 32) | (54 << 16) | 15),
        ),
        (
            "cuda=12.4".into(),
            Field::Cuda,
            Value::Number((12 << 32) | (4 << 16)),
        ),
        (
            format!("image=sha256:{}", "ab".repeat(32)),
            Field::Image,
            Value::Image(gpux_protocol::ImageDigest([0xab; 32])),
        ),
        (
            "image=pytorch*".into(),
            Field::Image,
            Value::ImageTag("pytorch*".into()),
        ),
        ("disk>=20".into(), Field::Disk, Value::Number(20)),
        ("stage>=2".into(), Field::Stage, Value::Number(2)),
        (
            "disk_price<=0.05".into(),
            Field::DiskPrice,
            Value::Number(50_000),
        ),
        ("cpu>=2.5".into(), Field::Cpu, Value::Number(2_500)),
        ("ram>=128".into(), Field::Ram, Value::Number(128)),
        (
            "disk_speed>=1000".into(),
            Field::DiskSpeed,
            Value::Number(1000),
        ),
        ("inet_up>=100".into(), Field::InetUp, Value::Number(100)),
        (
            "inet_down>=1000".into(),
            Field::InetDown,
            Value::Number(1000),
        ),
    ];
    for (text, field, value) in cases {
        let c = one(&text);
        assert_eq!((c.field, &c.values[..]), (field, &[value][..]), "{text}");
    }
    // Every field is covered above.
    assert_eq!(Field::ALL.len(), 24);
}

#[test]
fn bad_values_name_the_field_and_column() {
    for (text, field, column) in [
        ("vram=lots", Field::Vram, 6),
        ("count=-1", Field::Count, 7),
        ("price=1e3", Field::Price, 7),
        ("cc=nine", Field::Cc, 4),
        ("reliability=1.5", Field::Reliability, 13),
        ("reliability=0.9999", Field::Reliability, 13),
        ("tier=gold", Field::Tier, 6),
        ("spot=maybe", Field::Spot, 6),
        ("host=nobody", Field::Host, 6),
        ("driver=x", Field::Driver, 8),
        ("image=sha256:latest", Field::Image, 7),
        ("image=py*torch", Field::Image, 7),
    ] {
        let e = fails(text);
        assert_eq!(e.column, column, "{text}: {e}");
        assert!(
            matches!(e.kind, QueryErrorKind::BadValue { field: f, .. } if f == field),
            "{text}: {e}"
        );
    }
}

#[test]
fn unknown_fields_point_at_the_column_and_suggest() {
    let e = fails("gpu=H100 vrma>=80");
    assert_eq!(
        e.to_string(),
        "unknown field 'vrma' at column 10; did you mean 'vram'?"
    );
    assert_eq!(
        fails("prise<3").to_string(),
        "unknown field 'prise' at column 1; did you mean 'price'?"
    );
    assert_eq!(
        fails("pcie=4").to_string(),
        "unknown field 'pcie' at column 1; did you mean 'pcie_gen'?"
    );
    assert_eq!(
        fails("relia=1").to_string(),
        "unknown field 'relia' at column 1; did you mean 'reliability'?"
    );
    assert_eq!(
        fails("zzz=1").to_string(),
        "unknown field 'zzz' at column 1"
    );
    assert_eq!(
        fails("vram>=80 ordr=price").to_string(),
        "unknown field 'ordr' at column 10; did you mean 'order'?"
    );
}

#[test]
fn unknown_gpus_suggest_a_family() {
    let e = fails("gpu=h10");
    assert_eq!(e.column, 5);
    assert_eq!(
        e.to_string(),
        "unknown GPU 'h10' at column 5; did you mean 'h100'?"
    );
    assert!(matches!(
        fails("gpu=voodoo").kind,
        QueryErrorKind::UnknownGpu {
            suggestion: None,
            ..
        }
    ));
}

#[test]
fn structure_errors_have_columns() {
    let e = fails("vram");
    assert_eq!(
        (
            e.column,
            matches!(e.kind, QueryErrorKind::ExpectedOperator { .. })
        ),
        (5, true)
    );
    let e = fails("vram>=");
    assert_eq!(
        (
            e.column,
            matches!(e.kind, QueryErrorKind::ExpectedValue { .. })
        ),
        (7, true)
    );
    let e = fails("gpu<h100");
    assert_eq!(
        (
            e.column,
            matches!(e.kind, QueryErrorKind::OperatorNotAllowed { .. })
        ),
        (4, true)
    );
    assert_eq!(
        e.to_string(),
        "'gpu' cannot be compared with '<' (at column 4); use = != in notin"
    );
    assert!(matches!(
        fails("gpu in h100").kind,
        QueryErrorKind::ExpectedList
    ));
    let e = fails("gpu in [h100,a100");
    assert_eq!(
        (e.column, matches!(e.kind, QueryErrorKind::UnterminatedList)),
        (8, true)
    );
    assert!(matches!(fails("gpu in []").kind, QueryErrorKind::EmptyList));
    let e = fails("vram>=80 >= 3");
    assert_eq!(
        (
            e.column,
            matches!(e.kind, QueryErrorKind::UnexpectedToken(_))
        ),
        (10, true)
    );
    let e = fails("vram>=80 & gpu=h100");
    assert_eq!(
        (e.column, e.kind.clone()),
        (10, QueryErrorKind::UnexpectedChar('&'))
    );
    assert!(matches!(
        fails(&"x".repeat(2000)).kind,
        QueryErrorKind::TooLong { len: 2000 }
    ));
    let many = (0..40).map(|_| "vram>=1").collect::<Vec<_>>().join(" ");
    assert!(matches!(
        fails(&many).kind,
        QueryErrorKind::TooMany {
            what: "clauses",
            ..
        }
    ));
}

#[test]
fn columns_count_characters_not_bytes() {
    let e = fails("région=eu");
    // 'é' is two bytes but one column; it is not a word character, so the error is at 2.
    assert_eq!(e.column, 2);
}

#[test]
fn order_keys_and_directions() {
    let q = ok("gpu=h100 order=price-,reliability,age+");
    assert_eq!(
        q.order,
        [
            Ordering {
                key: OrderKey::Price,
                descending: true
            },
            Ordering {
                key: OrderKey::Reliability,
                descending: false
            },
            Ordering {
                key: OrderKey::Age,
                descending: false
            },
        ]
    );
    assert!(matches!(
        fails("order=").kind,
        QueryErrorKind::ExpectedOrderKey
    ));
    assert!(matches!(
        fails("order=price,").kind,
        QueryErrorKind::ExpectedOrderKey
    ));
    let e = fails("order=prcie");
    assert_eq!(
        e.to_string(),
        "unknown order key 'prcie' at column 7; did you mean 'price'?"
    );
    assert_eq!(
        ok("vram>=80").effective_order(),
        Query::DEFAULT_ORDER.to_vec()
    );
    let custom = ok("order=vram-").effective_order();
    assert_eq!(
        custom[0],
        Ordering {
            key: OrderKey::Vram,
            descending: true
        }
    );
    assert_eq!(custom.len(), 4);
}

#[test]
fn empty_query_matches_everything() {
    assert_eq!(ok(""), Query::default());
    assert_eq!(ok("   "), Query::default());
}

#[test]
fn image_tags_match_as_docker_reads_them() {
    use crate::query::tag_matches;
    assert!(tag_matches("pytorch:2.4", "pytorch:2.4"));
    assert!(!tag_matches("pytorch:2.4", "pytorch:2.41"));
    assert!(tag_matches("pytorch", "pytorch:latest"));
    assert!(!tag_matches("pytorch", "pytorch:2.4"));
    assert!(tag_matches("pytorch*", "pytorch:2.4"));
    assert!(tag_matches(
        "nvcr.io/nvidia/*",
        "nvcr.io/nvidia/pytorch:24.01"
    ));
    assert!(!tag_matches("torch*", "pytorch:2.4"));
}

#[test]
fn the_families_a_query_limits_itself_to() {
    let families = |q: &str| Query::parse(q).unwrap().families();
    assert_eq!(families("vram>=24 price<=3"), None);
    assert_eq!(families("gpu=h100"), Some([GpuFamily::H100].into()));
    assert_eq!(
        families("gpu in [h100, a100] region=eu"),
        Some([GpuFamily::H100, GpuFamily::A100].into())
    );
    // Two clauses intersect; `!=` and `notin` limit nothing.
    assert_eq!(
        families("gpu in [h100, a100] gpu=a100"),
        Some([GpuFamily::A100].into())
    );
    assert_eq!(families("gpu!=h100"), None);
    assert_eq!(families("gpu notin [h100]"), None);
}
