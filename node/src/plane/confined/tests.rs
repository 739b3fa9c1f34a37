//! The confined operations, on a real directory.
use super::*;

#[test]
fn paths_are_relative_and_plain() {
    for ok in ["a", "a/b.txt", "x y/z"] {
        check(ok).unwrap();
    }
    for bad in [
        "",
        "/etc",
        "../etc",
        "a/../../b",
        "a//b",
        "a/./b",
        "a/",
        "a\0b",
    ] {
        assert!(check(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn parts_sit_beside_their_file_and_fit_a_name() {
    assert_eq!(part_of("a/b/c.bin"), "a/b/.c.bin.gpux-part");
    assert_eq!(part_of("c.bin"), ".c.bin.gpux-part");
    let ws = tempfile::tempdir().unwrap();
    let root = Root::open_local(ws.path()).unwrap();
    root.mkdir_all("d").unwrap();
    // Names up to the longest a filesystem takes have parts it takes too, each their own.
    let mut parts = std::collections::BTreeSet::new();
    for len in [244, 245, 254, 255] {
        for last in ['x', 'y'] {
            let name = format!("{}{last}", "n".repeat(len - 1));
            let part = part_of(&format!("d/{name}"));
            root.open_write(&part).unwrap();
            root.rename_in_place(&part, &format!("d/{name}")).unwrap();
            assert!(parts.insert(part));
        }
    }
    assert_eq!(std::fs::read_dir(ws.path().join("d")).unwrap().count(), 8);
    for (name, part) in [
        (".x.gpux-part", true),
        (&part_of(&"n".repeat(250)), true),
        ("x.gpux-part", false),
        (".gpux-part", false),
        (".x.gpux-part.txt", false),
    ] {
        assert_eq!(is_part_name(name), part, "{name}");
    }
}

#[test]
fn a_walk_reports_names_that_are_not_utf8_and_stops_at_its_limits_as_it_reads() {
    use std::os::unix::ffi::OsStrExt;
    let ws = tempfile::tempdir().unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"odd\xff");
    std::fs::create_dir(ws.path().join(odd)).unwrap();
    std::fs::write(ws.path().join(odd).join("inside"), b"x").unwrap();
    std::fs::write(ws.path().join("plain"), b"x").unwrap();
    let root = Root::open(ws.path()).unwrap();
    let limit = |entries, path_bytes| Limit {
        entries,
        path_bytes,
    };
    let walked = root.walk("", limit(100, 1 << 20)).unwrap();
    let listed: Vec<(&str, bool)> = walked
        .iter()
        .map(|w| (w.path.as_str(), w.stat.is_some()))
        .collect();
    // Listed (without a kind) and not entered.
    assert_eq!(listed, [("odd\u{fffd}", false), ("plain", true)]);

    let many = ws.path().join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..50 {
        std::fs::write(many.join(format!("f{i:02}")), b"").unwrap();
    }
    let e = root.walk("many", limit(49, 1 << 20)).err().unwrap();
    assert!(e.to_string().contains("more than 49 entries"), "{e}");
    assert_eq!(root.walk("many", limit(50, 1 << 20)).unwrap().len(), 50);
    let e = root.walk("many", limit(50, 100)).err().unwrap();
    assert!(e.to_string().contains("MiB of paths"), "{e}");
}

#[test]
fn nothing_outside_the_root_or_through_a_link_is_reached() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"host").unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("d")).unwrap();
    std::fs::write(ws.path().join("d/f"), b"mine").unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
    std::os::unix::fs::symlink("d", ws.path().join("inner")).unwrap();
    let root = Root::open(ws.path()).unwrap();

    assert_eq!(
        std::io::read_to_string(root.open_read("d/f").unwrap()).unwrap(),
        "mine"
    );
    for through_link in ["out/secret", "inner/f"] {
        let e = root.open_read(through_link).unwrap_err();
        assert!(matches!(e, PathError::Outside(_)), "{through_link}: {e}");
        let e = root.open_write(through_link).unwrap_err();
        assert!(matches!(e, PathError::Outside(_)), "{through_link}: {e}");
    }
    assert!(matches!(root.open_read("out"), Err(PathError::Outside(_))));
    assert!(root.mkdir_all("out/new").is_err());
    assert!(!outside.path().join("new").exists());
    assert!(matches!(root.open_read("../x"), Err(PathError::Invalid(_))));

    root.mkdir_all("a/b/c").unwrap();
    let mut f = root.open_write("a/b/c/x.part").unwrap();
    std::io::Write::write_all(&mut f, b"data").unwrap();
    root.rename_in_place("a/b/c/x.part", "a/b/c/x").unwrap();
    assert_eq!(std::fs::read(ws.path().join("a/b/c/x")).unwrap(), b"data");

    let listed: Vec<String> = root
        .walk(
            "",
            Limit {
                entries: 100,
                path_bytes: 1 << 20,
            },
        )
        .unwrap()
        .into_iter()
        .map(|w| w.path)
        .collect();
    assert_eq!(
        listed,
        ["a", "a/b", "a/b/c", "a/b/c/x", "d", "d/f", "inner", "out"]
    );
    assert_eq!(
        std::fs::read(outside.path().join("secret")).unwrap(),
        b"host"
    );
}

#[test]
fn a_fifo_is_refused_at_once_and_what_is_opened_blocks_as_a_file_does() {
    let ws = tempfile::tempdir().unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        ws.path().join("p"),
        Mode::from_raw_mode(0o600),
    )
    .unwrap();
    std::fs::write(ws.path().join("f"), b"x").unwrap();
    let root = Root::open(ws.path()).unwrap();
    // Nothing opens the fifo's other end: a blocking open would never return.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let read = root.open_read("p").map(|_| ());
        let write = root.open_write("p").map(|_| ());
        let file = root.open_read("f").unwrap();
        let flags = rustix::fs::fcntl_getfl(&file).unwrap();
        let _ = tx.send((read, write, flags));
    });
    let (read, write, flags) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("opening a fifo blocked");
    assert!(matches!(read, Err(PathError::NotAFile(_))), "{read:?}");
    assert!(write.is_err(), "{write:?}");
    assert!(!flags.contains(OFlags::NONBLOCK));
}
