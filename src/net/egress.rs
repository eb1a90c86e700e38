//! Egress policy: which addresses outbound HTTP connections (remote children, SSE `endpoint`
//! URLs, OAuth/JWKS fetches, Vault) may reach, decided when the connection is made.
//!
//! Design note. A destination is admitted in three places, so that no path can skip it:
//! 1. [`Policy::resolve`] before a child connection: the URL's host is resolved **once**, every
//!    address is checked, and the connection's HTTP client is pinned to exactly those addresses
//!    (reqwest `resolve_to_addrs`), so nothing re-resolves the name for that connection.
//! 2. [`PolicyResolver`], the DNS resolver of every egress client, checks any other name the
//!    client is asked to reach (an OAuth `jwks_uri`, ...) the same way.
//! 3. [`ConnectGuard`], a connector layer, checks the peer address of every TCP connection the
//!    client opens (IP-literal URLs never reach a DNS resolver) and drops a refused one before a
//!    single byte of HTTP is written.
//!
//! Rules: loopback, RFC 1918, link-local (incl. 169.254.169.254), CGNAT 100.64/10, ULA fc00::/7,
//! multicast, unspecified, broadcast and reserved addresses are refused unless the host (or the
//! address, or a CIDR holding it) is allow-listed (`allowedPrivateHosts` on the entry,
//! `--allowed-private-host` for the gateway). IPv4 addresses embedded in IPv6 (mapped,
//! compatible, NAT64, 6to4) are judged by the IPv4 address. Loopback is allowed without a list
//! only in the local-development profile (graph-os listens on loopback only). Plain `http://`
//! is allowed only to allow-listed hosts or, in that profile, loopback. A name resolving to
//! several addresses is refused when **any** of them is refused (an attacker-controlled zone
//! cannot mix a public and a private answer).

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;

/// How long one DNS resolution may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most addresses remembered per client as admitted by name (allow-listed names).
const MAX_ADMITTED: usize = 1024;

/// Why an address or URL is refused. The stable code of every refusal is `egress-denied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918: 10/8, 172.16/12, 192.168/16 (and the deprecated IPv6 site-local fec0::/10).
    Private,
    /// 169.254/16 (incl. the cloud metadata address 169.254.169.254), fe80::/10.
    LinkLocal,
    /// Carrier-grade NAT 100.64/10.
    Cgnat,
    /// IPv6 unique local fc00::/7.
    UniqueLocal,
    /// 224/4, ff00::/8.
    Multicast,
    /// 0.0.0.0/8, ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// 240/4 (reserved for future use).
    Reserved,
    /// Plain `http://` to a host that is neither allow-listed nor (local profile) loopback.
    PlainHttp,
    /// Not an `http`/`https` URL.
    Scheme,
}

impl Rule {
    /// Short stable name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Loopback => "loopback",
            Rule::Private => "private (RFC 1918)",
            Rule::LinkLocal => "link-local (169.254.0.0/16, cloud metadata)",
            Rule::Cgnat => "carrier-grade NAT (100.64.0.0/10)",
            Rule::UniqueLocal => "unique local (fc00::/7)",
            Rule::Multicast => "multicast",
            Rule::Unspecified => "unspecified",
            Rule::Broadcast => "broadcast",
            Rule::Reserved => "reserved (240.0.0.0/4)",
            Rule::PlainHttp => "plain http",
            Rule::Scheme => "scheme",
        }
    }
}

/// The category of an address, or `None` for a public unicast address.
pub fn classify(ip: IpAddr) -> Option<Rule> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Rule> {
    let o = ip.octets();
    if ip.is_unspecified() || o[0] == 0 {
        Some(Rule::Unspecified)
    } else if ip.is_loopback() {
        Some(Rule::Loopback)
    } else if ip.is_private() {
        Some(Rule::Private)
    } else if ip.is_link_local() {
        Some(Rule::LinkLocal)
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some(Rule::Cgnat)
    } else if ip.is_multicast() {
        Some(Rule::Multicast)
    } else if ip.is_broadcast() {
        Some(Rule::Broadcast)
    } else if o[0] >= 240 {
        Some(Rule::Reserved)
    } else {
        None
    }
}

/// The IPv4 address an IPv6 address carries: mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`,
/// NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:aabb:ccdd::`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        return Some(tail);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

fn classify_v6(ip: Ipv6Addr) -> Option<Rule> {
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Some(Rule::Unspecified)
    } else if ip.is_loopback() {
        Some(Rule::Loopback)
    } else if (first & 0xfe00) == 0xfc00 {
        Some(Rule::UniqueLocal)
    } else if (first & 0xffc0) == 0xfe80 {
        Some(Rule::LinkLocal)
    } else if (first & 0xffc0) == 0xfec0 {
        Some(Rule::Private)
    } else if (first & 0xff00) == 0xff00 {
        Some(Rule::Multicast)
    } else {
        None
    }
}

/// A refused destination: stable code `egress-denied`, naming the host and the rule (never a
/// header, a path or a query).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct EgressDenied {
    /// Host as written in the URL.
    pub host: String,
    /// The refused address, when the refusal is about one.
    pub address: Option<IpAddr>,
    /// The rule that refused it.
    pub rule: Rule,
}

impl EgressDenied {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        "egress-denied"
    }

    fn describe(&self) -> String {
        let at = match self.address {
            Some(a) if a.to_string() != self.host.trim_matches(['[', ']']) => {
                format!(" (resolved to {a})")
            }
            _ => String::new(),
        };
        match self.rule {
            Rule::PlainHttp => format!(
                "egress-denied: plain http to host '{}'{at} is allowed only to hosts in allowedPrivateHosts / \
                 --allowed-private-host (or loopback while graph-os listens on loopback only); use https",
                self.host
            ),
            Rule::Scheme => format!(
                "egress-denied: host '{}': only http:// and https:// URLs are reached",
                self.host
            ),
            Rule::Loopback => format!(
                "egress-denied: host '{}'{at} is loopback, allowed only while graph-os listens on loopback \
                 only, or with allowedPrivateHosts / --allowed-private-host",
                self.host
            ),
            rule => format!(
                "egress-denied: host '{}'{at} is a {} address; allow it with allowedPrivateHosts or \
                 --allowed-private-host",
                self.host,
                rule.name()
            ),
        }
    }
}

/// Why a destination could not be reached before any policy decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The policy refused it.
    #[error(transparent)]
    Denied(#[from] EgressDenied),
    /// The name did not resolve (or not in time).
    #[error("cannot resolve host '{host}': {reason}")]
    Resolve {
        /// Host as written.
        host: String,
        /// Resolver reason.
        reason: String,
    },
}

impl EgressError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            EgressError::Denied(d) => d.code(),
            EgressError::Resolve { .. } => "dns-resolution-failed",
        }
    }
}

/// Hosts, addresses and networks allowed despite being private/loopback or plain http.
///
/// Entries: a host name (`intranet`, `mcp.corp.example`; case-insensitive, trailing dot
/// ignored), `*.suffix` (any name below `suffix`), an IP address, or a CIDR (`10.1.0.0/16`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    names: Vec<String>,
    suffixes: Vec<String>,
    nets: Vec<(IpAddr, u8)>,
}

fn norm_host(host: &str) -> String {
    host.trim_matches(['[', ']'])
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

impl Allowlist {
    /// Parses entries; the error names the first bad entry's position (never its text is needed).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let mut out = Allowlist::default();
        for (i, raw) in entries.iter().enumerate() {
            out.add(raw.as_ref())
                .map_err(|reason| format!("entry {i}: {reason}"))?;
        }
        Ok(out)
    }

    fn add(&mut self, raw: &str) -> Result<(), String> {
        let e = raw.trim();
        if e.is_empty() || e.len() > 253 {
            return Err("must be 1..253 characters".into());
        }
        if let Some((addr, bits)) = e.split_once('/') {
            let ip: IpAddr = addr
                .trim_matches(['[', ']'])
                .parse()
                .map_err(|_| "a CIDR must be ADDRESS/BITS".to_string())?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = bits
                .parse()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("a CIDR prefix length must be 0..{max}"))?;
            self.nets.push((ip, bits));
            return Ok(());
        }
        if let Ok(ip) = e.trim_matches(['[', ']']).parse::<IpAddr>() {
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            self.nets.push((ip, bits));
            return Ok(());
        }
        let (wild, name) = match e.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, e),
        };
        let name = norm_host(name);
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err("must be a host name, *.domain, an IP address or a CIDR".into());
        }
        if wild {
            self.suffixes.push(name);
        } else {
            self.names.push(name);
        }
        Ok(())
    }

    /// Adds every entry of `other`.
    pub fn extend(&mut self, other: &Allowlist) {
        self.names.extend(other.names.iter().cloned());
        self.suffixes.extend(other.suffixes.iter().cloned());
        self.nets.extend(other.nets.iter().copied());
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.suffixes.is_empty() && self.nets.is_empty()
    }

    /// Whether the host as written is allowed (by name, or as an address in an allowed net).
    pub fn host_allowed(&self, host: &str) -> bool {
        let h = norm_host(host);
        if let Ok(ip) = h.parse::<IpAddr>() {
            return self.ip_allowed(ip);
        }
        self.names.contains(&h)
            || self.suffixes.iter().any(|s| {
                h.len() > s.len()
                    && h.ends_with(s.as_str())
                    && h[..h.len() - s.len()].ends_with('.')
            })
    }

    /// Whether an address lies in an allowed address or network.
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        self.nets
            .iter()
            .any(|(net, bits)| in_net(ip, canonical_ip(*net), *bits))
    }
}

/// IPv4-mapped IPv6 addresses compare as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits as u32)
            };
            (u32::from(a) & mask) == (u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits as u32)
            };
            (u128::from(a) & mask) == (u128::from(n) & mask)
        }
        _ => false,
    }
}

/// Gateway-level egress settings (`--allowed-private-host`, the listen profile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayEgress {
    /// Loopback destinations are allowed without an allow-list entry (local-development
    /// profile: graph-os listens on loopback only).
    pub allow_loopback: bool,
    /// Allowed for every entry.
    pub allowed: Allowlist,
}

impl Default for GatewayEgress {
    /// The local-development profile with no allow-list (the library default; `serve` sets the
    /// real one from its listen addresses and flags).
    fn default() -> Self {
        GatewayEgress {
            allow_loopback: true,
            allowed: Allowlist::default(),
        }
    }
}

static GATEWAY: RwLock<Option<GatewayEgress>> = RwLock::new(None);

/// Installs the gateway-level settings (called once by `serve`, before any child starts).
pub fn set_gateway(settings: GatewayEgress) {
    if let Ok(mut g) = GATEWAY.write() {
        *g = Some(settings);
    }
}

/// The gateway-level settings in force.
pub fn gateway() -> GatewayEgress {
    GATEWAY
        .read()
        .ok()
        .and_then(|g| g.clone())
        .unwrap_or_default()
}

/// The effective policy of one destination: the gateway's settings plus an entry's
/// `allowedPrivateHosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    allow_loopback: bool,
    allowed: Allowlist,
}

/// A resolved, admitted destination: the connection is pinned to `addrs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// Host as written in the URL (lowercase, without brackets).
    pub host: String,
    /// Every admitted address (with the URL's port).
    pub addrs: Vec<SocketAddr>,
}

impl Policy {
    /// The gateway-level policy alone (OAuth, Vault).
    pub fn gateway() -> Policy {
        Policy::with(&gateway(), &Allowlist::default())
    }

    /// `gateway` plus an entry's allow-list.
    pub fn with(gateway: &GatewayEgress, entry: &Allowlist) -> Policy {
        let mut allowed = gateway.allowed.clone();
        allowed.extend(entry);
        Policy {
            allow_loopback: gateway.allow_loopback,
            allowed,
        }
    }

    /// The gateway-level policy plus an entry's `allowedPrivateHosts` (entries that do not
    /// parse were refused when the config was validated; here they are ignored).
    pub fn for_entry(entry_hosts: &[String]) -> Policy {
        let entry = Allowlist::parse(entry_hosts).unwrap_or_default();
        Policy::with(&gateway(), &entry)
    }

    /// Whether loopback is allowed without a list.
    pub fn allows_loopback(&self) -> bool {
        self.allow_loopback
    }

    fn ip_admitted(&self, host: &str, ip: IpAddr) -> Result<(), EgressDenied> {
        match classify(ip) {
            None => Ok(()),
            Some(Rule::Loopback) if self.allow_loopback => Ok(()),
            Some(_) if self.allowed.host_allowed(host) || self.allowed.ip_allowed(ip) => Ok(()),
            Some(rule) => Err(EgressDenied {
                host: host.to_string(),
                address: Some(ip),
                rule,
            }),
        }
    }

    /// Checks one address a connection to `host` would use (scheme `https` unless `plain`).
    pub fn check_addr(&self, host: &str, ip: IpAddr, plain: bool) -> Result<(), EgressDenied> {
        self.ip_admitted(host, ip)?;
        let plain_ok = self.allowed.host_allowed(host)
            || self.allowed.ip_allowed(ip)
            || (self.allow_loopback && classify(ip) == Some(Rule::Loopback));
        if plain && !plain_ok {
            return Err(EgressDenied {
                host: host.to_string(),
                address: Some(ip),
                rule: Rule::PlainHttp,
            });
        }
        Ok(())
    }

    /// What can be decided without DNS: the scheme, and for an IP-literal host the address; for
    /// plain http also a name that is neither allow-listed nor (local profile) `localhost`.
    pub fn check_static(&self, url: &url::Url) -> Result<(), EgressDenied> {
        let host = url_host(url);
        let plain = match url.scheme() {
            "https" => false,
            "http" => true,
            _ => {
                return Err(EgressDenied {
                    host,
                    address: None,
                    rule: Rule::Scheme,
                });
            }
        };
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_addr(&host, IpAddr::V4(ip), plain),
            Some(url::Host::Ipv6(ip)) => self.check_addr(&host, IpAddr::V6(ip), plain),
            Some(url::Host::Domain(_)) => {
                let local_name = host == "localhost" || host.ends_with(".localhost");
                if local_name && !self.allow_loopback && !self.allowed.host_allowed(&host) {
                    return Err(EgressDenied {
                        host,
                        address: None,
                        rule: Rule::Loopback,
                    });
                }
                if plain
                    && !self.allowed.host_allowed(&host)
                    && !(local_name && self.allow_loopback)
                {
                    return Err(EgressDenied {
                        host,
                        address: None,
                        rule: Rule::PlainHttp,
                    });
                }
                Ok(())
            }
            None => Err(EgressDenied {
                host,
                address: None,
                rule: Rule::Scheme,
            }),
        }
    }

    /// Resolves the URL's host once and checks every address; the connection must then use
    /// exactly [`Pinned::addrs`].
    pub async fn resolve(&self, url: &url::Url) -> Result<Pinned, EgressError> {
        self.check_static(url)?;
        let host = url_host(url);
        let port = url.port_or_known_default().unwrap_or(443);
        let plain = url.scheme() == "http";
        let addrs: Vec<SocketAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
            Some(url::Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
            _ => lookup(&host, port).await?,
        };
        for a in &addrs {
            self.check_addr(&host, a.ip(), plain)?;
        }
        Ok(Pinned { host, addrs })
    }
}

/// The URL's host as written (lowercase; IPv6 without brackets).
pub fn url_host(url: &url::Url) -> String {
    match url.host() {
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        Some(h) => h.to_string().to_ascii_lowercase(),
        None => String::new(),
    }
}

async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, EgressError> {
    let resolve_err = |reason: String| EgressError::Resolve {
        host: host.to_string(),
        reason,
    };
    let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| resolve_err(format!("no answer within {RESOLVE_TIMEOUT:?}")))?
        .map_err(|e| resolve_err(e.to_string()))?;
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for a in found {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    if addrs.is_empty() {
        return Err(resolve_err("no addresses".into()));
    }
    Ok(addrs)
}

/// Addresses a client admitted through an allow-listed *name* (the connector guard sees only
/// addresses, so it needs to know which private ones the resolver let through).
#[derive(Debug, Default)]
struct Admitted(Mutex<HashSet<IpAddr>>);

impl Admitted {
    fn insert(&self, ip: IpAddr) {
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= MAX_ADMITTED {
                set.clear();
            }
            set.insert(canonical_ip(ip));
        }
    }
    fn contains(&self, ip: IpAddr) -> bool {
        self.0
            .lock()
            .map(|s| s.contains(&canonical_ip(ip)))
            .unwrap_or(false)
    }
}

/// The shared state of one egress client's resolver and connector guard.
#[derive(Debug, Clone)]
pub struct Guard {
    policy: Arc<Policy>,
    admitted: Arc<Admitted>,
}

impl Guard {
    /// Guards a client under `policy`; `pinned` addresses are admitted up front.
    pub fn new(policy: Policy, pinned: Option<&Pinned>) -> Guard {
        let guard = Guard {
            policy: Arc::new(policy),
            admitted: Arc::new(Admitted::default()),
        };
        for a in pinned.map(|p| p.addrs.as_slice()).unwrap_or_default() {
            guard.admitted.insert(a.ip());
        }
        guard
    }

    /// The DNS resolver to install with `ClientBuilder::dns_resolver`.
    pub fn resolver(&self) -> Arc<PolicyResolver> {
        Arc::new(PolicyResolver(self.clone()))
    }

    /// The connector layer to install with `ClientBuilder::connector_layer`.
    pub fn layer(&self) -> ConnectGuard {
        ConnectGuard(self.clone())
    }

    fn peer_allowed(&self, ip: IpAddr) -> Result<(), EgressDenied> {
        if self.admitted.contains(ip) {
            return Ok(());
        }
        self.policy.ip_admitted(&ip.to_string(), ip)
    }
}

/// The DNS resolver of every egress client: resolves, then refuses the whole answer if any
/// address is refused.
#[derive(Debug)]
pub struct PolicyResolver(Guard);

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.0.clone();
        let host = name.as_str().to_ascii_lowercase();
        Box::pin(async move {
            let addrs = lookup(&host, 0).await?;
            for a in &addrs {
                guard.policy.ip_admitted(&host, a.ip())?;
                if classify(a.ip()).is_some() {
                    guard.admitted.insert(a.ip());
                }
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Connector layer: checks the peer address of every new connection and drops a refused one
/// before any HTTP byte is written.
#[derive(Debug, Clone)]
pub struct ConnectGuard(Guard);

impl<S> tower::Layer<S> for ConnectGuard {
    type Service = GuardedConnector<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GuardedConnector {
            inner,
            guard: self.0.clone(),
        }
    }
}

/// The service [`ConnectGuard`] wraps a connector in.
#[derive(Debug, Clone)]
pub struct GuardedConnector<S> {
    inner: S,
    guard: Guard,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, Req> tower::Service<Req> for GuardedConnector<S>
where
    S: tower::Service<Req>,
    S::Response: hyper_util::client::legacy::connect::Connection + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let fut = self.inner.call(req);
        let guard = self.guard.clone();
        Box::pin(async move {
            use hyper_util::client::legacy::connect::Connection;
            let conn = fut.await.map_err(Into::into)?;
            let mut extras = http::Extensions::new();
            conn.connected().get_extras(&mut extras);
            let Some(info) = extras.get::<hyper_util::client::legacy::connect::HttpInfo>() else {
                // No peer address (not a TCP connection): nothing to judge, refuse.
                return Err("egress-denied: connection without a peer address".into());
            };
            guard.peer_allowed(info.remote_addr().ip())?;
            Ok(conn)
        })
    }
}

/// An egress HTTP client: no redirects, no proxy, rustls (`tls`), the policy resolver and the
/// connector guard; pinned to `pinned` when given.
pub fn client(
    policy: Policy,
    pinned: Option<&Pinned>,
    tls: Option<rustls::ClientConfig>,
) -> Result<reqwest::Client, String> {
    super::crypto::install_crypto();
    let guard = Guard::new(policy, pinned);
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .dns_resolver(guard.resolver())
        .connector_layer(guard.layer());
    if let Some(p) = pinned
        && p.host.parse::<IpAddr>().is_err()
    {
        builder = builder.resolve_to_addrs(&p.host, &p.addrs);
    }
    if let Some(tls) = tls {
        builder = builder.tls_backend_preconfigured(tls);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Finds an [`EgressDenied`] in an error's source chain (a refusal inside reqwest).
pub fn denied_in(err: &(dyn std::error::Error + 'static)) -> Option<EgressDenied> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(d) = e.downcast_ref::<EgressDenied>() {
            return Some(d.clone());
        }
        if let Some(EgressError::Denied(d)) = e.downcast_ref::<EgressError>() {
            return Some(d.clone());
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_private_category_is_classified() {
        for (addr, rule) in [
            ("127.0.0.1", Rule::Loopback),
            ("127.255.1.2", Rule::Loopback),
            ("::1", Rule::Loopback),
            ("10.0.0.5", Rule::Private),
            ("172.16.0.1", Rule::Private),
            ("172.31.255.255", Rule::Private),
            ("192.168.1.1", Rule::Private),
            ("169.254.169.254", Rule::LinkLocal),
            ("fe80::1", Rule::LinkLocal),
            ("100.64.0.1", Rule::Cgnat),
            ("100.127.255.255", Rule::Cgnat),
            ("fc00::1", Rule::UniqueLocal),
            ("fd12:3456::1", Rule::UniqueLocal),
            ("224.0.0.1", Rule::Multicast),
            ("ff02::1", Rule::Multicast),
            ("0.0.0.0", Rule::Unspecified),
            ("0.1.2.3", Rule::Unspecified),
            ("::", Rule::Unspecified),
            ("255.255.255.255", Rule::Broadcast),
            ("240.0.0.1", Rule::Reserved),
            ("::ffff:127.0.0.1", Rule::Loopback),
            ("::ffff:169.254.169.254", Rule::LinkLocal),
            ("::ffff:10.0.0.1", Rule::Private),
            ("::10.0.0.1", Rule::Private),
            ("64:ff9b::a9fe:a9fe", Rule::LinkLocal),
            ("2002:0a00:0001::", Rule::Private),
            ("fec0::1", Rule::Private),
        ] {
            assert_eq!(classify(ip(addr)), Some(rule), "{addr}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "192.0.2.2",
        ] {
            assert_eq!(classify(ip(public)), None, "{public}");
        }
    }

    #[test]
    fn allowlists_match_names_suffixes_addresses_and_networks() {
        let a =
            Allowlist::parse(&["Intranet.", "*.corp.example", "10.1.0.0/16", "fd00::5"]).unwrap();
        assert!(a.host_allowed("intranet"));
        assert!(a.host_allowed("mcp.corp.example"));
        assert!(!a.host_allowed("corp.example"));
        assert!(!a.host_allowed("evilcorp.example"));
        assert!(a.ip_allowed(ip("10.1.200.3")));
        assert!(a.ip_allowed(ip("::ffff:10.1.0.1")));
        assert!(!a.ip_allowed(ip("10.2.0.1")));
        assert!(a.host_allowed("[fd00::5]"));
        for bad in ["", "a b", "10.0.0.0/33", "x/1", "*.", "a..b"] {
            assert!(Allowlist::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn static_checks_name_the_rule() {
        let remote = Policy {
            allow_loopback: false,
            allowed: Allowlist::default(),
        };
        let deny = |p: &Policy, u: &str| {
            p.check_static(&url::Url::parse(u).unwrap())
                .err()
                .map(|e| e.rule)
        };
        assert_eq!(
            deny(&remote, "https://169.254.169.254/mcp"),
            Some(Rule::LinkLocal)
        );
        assert_eq!(deny(&remote, "https://10.0.0.5/mcp"), Some(Rule::Private));
        assert_eq!(deny(&remote, "https://127.0.0.1/mcp"), Some(Rule::Loopback));
        assert_eq!(
            deny(&remote, "https://[::ffff:7f00:1]/mcp"),
            Some(Rule::Loopback)
        );
        assert_eq!(deny(&remote, "https://localhost/mcp"), Some(Rule::Loopback));
        assert_eq!(
            deny(&remote, "http://example.com/mcp"),
            Some(Rule::PlainHttp)
        );
        assert_eq!(deny(&remote, "https://example.com/mcp"), None);
        let local = Policy {
            allow_loopback: true,
            allowed: Allowlist::default(),
        };
        assert_eq!(deny(&local, "http://127.0.0.1:9/mcp"), None);
        assert_eq!(deny(&local, "http://localhost:9/mcp"), None);
        assert_eq!(deny(&local, "http://10.0.0.1/mcp"), Some(Rule::Private));
        let listed = Policy::with(
            &GatewayEgress {
                allow_loopback: false,
                allowed: Allowlist::parse(&["10.0.0.0/8", "intranet"]).unwrap(),
            },
            &Allowlist::default(),
        );
        assert_eq!(deny(&listed, "http://10.0.0.1/mcp"), None);
        assert_eq!(deny(&listed, "http://intranet/mcp"), None);
        let e = remote
            .check_static(&url::Url::parse("https://10.0.0.5/mcp").unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "egress-denied");
        assert!(
            e.to_string().contains("'10.0.0.5'") && e.to_string().contains("RFC 1918"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_name_is_resolved_once_and_every_address_checked() {
        let remote = Policy {
            allow_loopback: false,
            allowed: Allowlist::default(),
        };
        let url = url::Url::parse("https://localhost:1/mcp").unwrap();
        let err = remote.resolve(&url).await.unwrap_err();
        assert_eq!(err.code(), "egress-denied");
        let allowed = Policy::with(
            &GatewayEgress {
                allow_loopback: false,
                allowed: Allowlist::parse(&["localhost"]).unwrap(),
            },
            &Allowlist::default(),
        );
        let pinned = allowed.resolve(&url).await.unwrap();
        assert!(
            pinned
                .addrs
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 1)
        );
    }
}
