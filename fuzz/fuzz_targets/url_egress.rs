//! The URL model and the egress policy: parsing never panics; an accepted URL is http(s) with a
//! host, no user info, and reparses to itself; an IP-literal host the remote profile admits is a
//! public address; IPv4-mapped IPv6 addresses are judged as their IPv4 address.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use graph_os::config::urls::parse_remote_url;
use graph_os::net::egress::{Allowlist, GatewayEgress, Policy, classify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let mut b = [0u8; 16];
        b.copy_from_slice(&data[..16]);
        let v6 = Ipv6Addr::from(b);
        let v4 = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
        let _ = classify(IpAddr::V6(v6));
        let mapped = v4.to_ipv6_mapped();
        assert_eq!(classify(IpAddr::V6(mapped)), classify(IpAddr::V4(v4)));
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Allowlist::parse(&[text]);
    let Ok(url) = parse_remote_url(text) else {
        return;
    };
    assert!(matches!(url.scheme(), "http" | "https"));
    assert!(url.host_str().is_some_and(|h| !h.is_empty()));
    assert!(url.username().is_empty() && url.password().is_none());
    assert!(url.query().is_none() && url.fragment().is_none());
    let again = parse_remote_url(url.as_str()).expect("a parsed URL reparses");
    assert_eq!(again, url);
    let remote = Policy::with(
        &GatewayEgress {
            allow_loopback: false,
            allowed: Allowlist::default(),
        },
        &Allowlist::default(),
    );
    let local = Policy::with(&GatewayEgress::default(), &Allowlist::default());
    let r = remote.check_static(&url);
    let _ = local.check_static(&url);
    let ip = match url.host() {
        Some(url::Host::Ipv4(a)) => Some(IpAddr::V4(a)),
        Some(url::Host::Ipv6(a)) => Some(IpAddr::V6(a)),
        _ => None,
    };
    if let (Some(ip), Ok(())) = (ip, &r) {
        assert_eq!(classify(ip), None, "the remote profile admitted a private address {ip}");
    }
    if let Err(e) = r {
        assert_eq!(e.code(), "egress-denied");
        let _ = e.to_string();
    }
});
