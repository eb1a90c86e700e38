//! The one URL model of remote children: a child URL is parsed once with the `url` crate (the
//! WHATWG parser reqwest uses too), refused when the text as written and the parsed value
//! could disagree, and the parsed [`url::Url`] is what validation, the egress policy and the
//! connection all use.
//!
//! Refused, each with its own message: control characters or whitespace (the WHATWG parser
//! silently drops tabs and newlines), backslashes (it reads `\` as `/` in http(s) URLs, so
//! `http://127.0.0.1\.localhost/` would reach 127.0.0.1), schemes other than http/https,
//! userinfo, empty hosts, percent-encoded hosts (`10.1.2.3%2e`), hosts the parser rewrites
//! (`0x7f.1`, IDN, non-canonical IPv6: write them as the parser would), empty or zero ports,
//! queries and fragments.

/// Longest accepted URL (bytes).
pub const MAX_URL_BYTES: usize = 8192;

/// Parses a child URL as written in the config. The error says what is wrong without echoing
/// the URL (it may carry a mistyped credential).
pub fn parse_remote_url(raw: &str) -> Result<url::Url, String> {
    if raw.len() > MAX_URL_BYTES {
        return Err(format!("longer than {MAX_URL_BYTES} bytes"));
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("contains whitespace or control characters".into());
    }
    if raw.contains('\\') {
        return Err(
            "contains a backslash (URL parsers read it as '/', so the host would not be the one written)"
                .into(),
        );
    }
    let Some((scheme, rest)) = raw.split_once("://") else {
        return Err("must be an http:// or https:// URL".into());
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err("must be an http:// or https:// URL".into());
    }
    if raw.contains(['?', '#']) {
        return Err("must not carry a query or fragment".into());
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err("must not carry user info (put credentials in headers as references)".into());
    }
    if authority.contains('%') {
        return Err("the host must not be percent-encoded".into());
    }
    let (host, port) = split_authority(authority)?;
    if host.is_empty() {
        return Err("has no host".into());
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(0) => return Err("port 0 is not a port".into()),
            Ok(_) if !port.starts_with('0') => {}
            _ => return Err("the port must be a number 1..65535 (no leading zeros)".into()),
        }
    }
    let url = url::Url::parse(raw).map_err(|e| format!("not a valid URL: {e}"))?;
    let parsed_host = url.host_str().unwrap_or_default();
    if !parsed_host.eq_ignore_ascii_case(host) {
        return Err(format!(
            "the host is not in canonical form (a URL parser reads it as '{parsed_host}'; write that)"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not carry a query or fragment".into());
    }
    Ok(url)
}

/// Splits `host[:port]` / `[v6][:port]` as written.
fn split_authority(authority: &str) -> Result<(&str, Option<&str>), String> {
    if authority.starts_with('[') {
        let Some(end) = authority.find(']') else {
            return Err("an IPv6 host is missing its ']'".into());
        };
        let host = &authority[..=end];
        return match &authority[end + 1..] {
            "" => Ok((host, None)),
            rest => match rest.strip_prefix(':') {
                Some("") => Err("has an empty port".into()),
                Some(p) => Ok((host, Some(p))),
                None => Err("unexpected text after the IPv6 host".into()),
            },
        };
    }
    match authority.rsplit_once(':') {
        None => Ok((authority, None)),
        Some((_, "")) => Err("has an empty port".into()),
        Some((h, p)) => Ok((h, Some(p))),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_remote_url;

    #[test]
    fn parser_differentials_are_refused_with_their_own_message() {
        for (raw, needle) in [
            ("http://127.0.0.1\\.localhost:1/mcp", "backslash"),
            ("http://10.1.2.3\\.localhost/mcp", "backslash"),
            ("http://10.1.2.3%2e/", "percent-encoded"),
            ("http://user@10.0.0.1/", "user info"),
            ("https://u:p@a.example/mcp", "user info"),
            ("http:///mcp", "no host"),
            ("http://:80/mcp", "no host"),
            ("ftp://a.example/mcp", "http:// or https://"),
            ("file:///etc/passwd", "http:// or https://"),
            ("a.example/mcp", "http:// or https://"),
            ("http://0x7f.1/mcp", "canonical"),
            ("http://127.1/mcp", "canonical"),
            ("http://[0:0::1]/mcp", "canonical"),
            ("http://exa\tmple.com/mcp", "control"),
            ("http://a.example:/mcp", "empty port"),
            ("http://a.example:0/mcp", "port 0"),
            ("http://a.example:080/mcp", "leading zeros"),
            ("http://a.example:65536/mcp", "1..65535"),
            ("https://a.example/mcp?x=1", "query"),
            ("https://a.example/mcp#f", "fragment"),
            ("https://bücher.example/mcp", "canonical"),
        ] {
            let err = parse_remote_url(raw).unwrap_err();
            assert!(err.contains(needle), "{raw}: {err}");
        }
    }

    #[test]
    fn ordinary_urls_parse_once() {
        for raw in [
            "https://a.example/mcp",
            "HTTPS://A.Example:8443/mcp",
            "http://127.0.0.1:9/mcp",
            "http://[::1]:9/mcp",
            "https://xn--bcher-kva.example/sse",
            "https://a.example",
        ] {
            let url = parse_remote_url(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert!(matches!(url.scheme(), "http" | "https"));
        }
    }
}
