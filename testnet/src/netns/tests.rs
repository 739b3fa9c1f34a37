//! The isolated network's unit tests (root: they make namespaces, veths and rules).
use super::*;

/// One network at a time: the tests look for what this process left.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `work` on a thread inside `slot`'s namespace.
fn inside<T: Send + 'static>(
    slot: &Slot,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = slot.netns_path();
    std::thread::spawn(move || {
        let file = std::fs::File::open(path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        work()
    })
}

/// Whether `from` reaches a listener at `to`'s address within half a second.
fn reaches(from: &Slot, to: &Slot, port: u16) -> bool {
    let addr = std::net::SocketAddr::from((to.ip, port));
    inside(from, move || {
        TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(500)).is_ok()
    })
    .join()
    .unwrap()
}

#[test]
fn nodes_get_addresses_of_their_own_links_cut_and_heal_and_nothing_is_left() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let preflight = preflight();
    assert!(
        preflight.problems(&Shaping::default()).is_empty(),
        "this machine cannot run an isolated testnet: {preflight:?}"
    );
    let mut net = Network::create(Shaping::default()).unwrap();
    let a = net.add("a").unwrap();
    let b = net.add("b").unwrap();
    assert_ne!(a.ip, b.ip);
    assert_eq!(net.addresses().len(), 2);
    // A listener in b, on b's own address; the root namespace does not have it.
    let port = 4555;
    let bound = b.ip;
    let listener = inside(&b, move || {
        let l = TcpListener::bind((bound, port)).unwrap();
        l.set_nonblocking(true).unwrap();
        l
    })
    .join()
    .unwrap();
    assert!(reaches(&a, &b, port), "a does not reach b over the bridge");
    net.cut("a", "b").unwrap();
    assert!(!reaches(&a, &b, port), "a reaches b across a cut link");
    net.heal("a", "b").unwrap();
    assert!(reaches(&a, &b, port), "a does not reach b after the heal");
    drop(listener);
    assert!(net.teardown().is_empty());
    // The namespaces go once nothing in them is left (the threads above have ended).
    let pid = std::process::id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !leftovers(pid).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

#[test]
fn a_forward_carries_the_root_namespace_into_a_node_namespace_loopback() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut net = Network::create(Shaping::default()).unwrap();
    let slot = net.add("api").unwrap();
    let listener = inside(&slot, || TcpListener::bind("127.0.0.1:0").unwrap())
        .join()
        .unwrap();
    let inner = listener.local_addr().unwrap().port();
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
    });
    let forward = Forward::new(slot.netns_path()).unwrap();
    forward.point(inner);
    let mut conn = TcpStream::connect(("127.0.0.1", forward.port)).unwrap();
    conn.write_all(b"hello").unwrap();
    let mut back = [0u8; 5];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"hello");
    echo.join().unwrap();
    drop(conn);
    drop(forward);
    assert!(net.teardown().is_empty());
}

#[test]
fn a_node_behind_its_nat_dials_out_and_cannot_be_dialled() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut net = Network::create(Shaping::default()).unwrap();
    let public = net.add("public").unwrap();
    let hidden = net.add_behind_nat("hidden").unwrap();
    let nat = hidden.nat.clone().expect("behind a NAT");
    assert_eq!(hidden.ip.octets()[..2], [192, 168]);
    assert_eq!(
        net.behind_nat().get("hidden"),
        Some(&nat.public.to_string())
    );
    let port = 4556;
    let listen = |slot: &Slot| {
        let ip = slot.ip;
        inside(slot, move || TcpListener::bind((ip, port)).unwrap())
            .join()
            .unwrap()
    };
    let at_public = listen(&public);
    let _at_hidden = listen(&hidden);
    // Out through the NAT: the public node sees the NAT's address.
    let seen = std::thread::spawn(move || at_public.accept().map(|(_, from)| from.ip()));
    assert!(
        reaches(&hidden, &public, port),
        "the hidden node cannot dial out"
    );
    assert_eq!(
        seen.join().unwrap().unwrap(),
        std::net::IpAddr::V4(nat.public)
    );
    // In: neither its private address nor its NAT's leads to it.
    assert!(
        !reaches(&public, &hidden, port),
        "its private address is reachable"
    );
    let mut at_nat = hidden.clone();
    at_nat.ip = nat.public;
    assert!(
        !reaches(&public, &at_nat, port),
        "its NAT forwards a dial in"
    );
    drop(_at_hidden);
    assert!(net.teardown().is_empty());
}
