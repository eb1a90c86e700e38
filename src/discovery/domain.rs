//! Which configured servers a query names (domain-first discovery).
//!
//! find_tools never waits for a child that is still starting — unless the query names it: "open
//! a merge request in GitLab" is about `gitlab`, and answering it before gitlab is up would rank
//! look-alikes of other servers instead. [`named_servers`] decides that from configuration alone
//! (so it works for servers that have no catalog yet): a server is named by a query word that is
//! one of its naming words — the words of its name, of its name prefix, of its category and of
//! its hint — after the same analysis the index applies (splitting, lowercasing, stop words,
//! stemming; [`super::text::tokenize`]). A word is also taken whole, without its camelCase
//! humps split (`GitLab` is `gitlab` as well as `git` and `lab`), so a query's `GitLab` names
//! the server `gitlab`; prose (category and hint) is only taken whole.
//!
//! Not every word names a server:
//! - generic words (`mcp`, `server`, `api`, `tool`, `service`, `app`, `client`, `local`) never do;
//! - nor do words shorter than three letters or made of digits only;
//! - a word that names more than a quarter of the servers does not count (a word naming a
//!   single server always counts, however small the fleet).
//!
//! For servers that are up the index additionally boosts a server whose name words the query
//! contains (its own rule over its segments); this module only decides whom to wait for.

use super::text::{spaced, stem, tokenize};

/// Words too generic to name a server (compared after stemming).
pub const GENERIC: &[&str] = &[
    "mcp", "server", "api", "tool", "service", "app", "client", "local",
];

/// One configured server, as a query may name it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerNames<'a> {
    /// Server name (`gitlab`, `google-drive`).
    pub name: &'a str,
    /// Its exposed name prefix (`gl`); empty for transparent servers.
    pub prefix: &'a str,
    /// `category` from the configuration.
    pub category: Option<&'a str>,
    /// `hint` from the configuration.
    pub hint: Option<&'a str>,
}

/// The words that name `server` in a query (analysed like query words, generic and short
/// words removed), sorted and deduplicated.
pub fn naming_words(server: &ServerNames<'_>) -> Vec<String> {
    let mut words = Vec::new();
    for id in [server.name, server.prefix] {
        words.extend(tokenize(&spaced(id)));
        words.extend(tokenize(&id.to_lowercase()));
    }
    for text in [server.category, server.hint].into_iter().flatten() {
        words.extend(tokenize(&text.to_lowercase()));
    }
    let generic: Vec<String> = GENERIC.iter().map(|g| stem(g)).collect();
    words.retain(|w| {
        w.chars().count() >= 3 && !w.chars().all(|c| c.is_ascii_digit()) && !generic.contains(w)
    });
    words.sort();
    words.dedup();
    words
}

/// The names of the `servers` that `query` names, in the order given (see the module docs).
pub fn named_servers<'a>(servers: &[ServerNames<'a>], query: &str) -> Vec<&'a str> {
    let query: std::collections::HashSet<String> = tokenize(query)
        .into_iter()
        .chain(tokenize(&query.to_lowercase()))
        .collect();
    if query.is_empty() || servers.is_empty() {
        return Vec::new();
    }
    let words: Vec<Vec<String>> = servers.iter().map(naming_words).collect();
    let mut naming: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for w in words.iter().flatten() {
        *naming.entry(w.as_str()).or_default() += 1;
    }
    let limit = (servers.len() / 4).max(1);
    let mut named: Vec<&'a str> = Vec::new();
    for (server, words) in servers.iter().zip(&words) {
        let hit = words
            .iter()
            .any(|w| query.contains(w) && naming.get(w.as_str()).is_some_and(|n| *n <= limit));
        if hit && !named.contains(&server.name) {
            named.push(server.name);
        }
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &'static str) -> ServerNames<'static> {
        ServerNames {
            name,
            prefix: name,
            ..Default::default()
        }
    }

    #[test]
    fn a_query_names_a_server_by_its_name_in_any_case() {
        let fleet = [server("gitlab"), server("github")];
        assert_eq!(
            named_servers(&fleet, "open a merge request in GitLab"),
            ["gitlab"]
        );
        assert_eq!(named_servers(&fleet, "GITHUB issues"), ["github"]);
        assert_eq!(named_servers(&fleet, "gitlab"), ["gitlab"]);
        let camel = [server("GitLab"), server("github")];
        assert_eq!(named_servers(&camel, "merge on gitlab"), ["GitLab"]);
        assert!(named_servers(&fleet, "open a merge request").is_empty());
    }

    #[test]
    fn any_word_of_a_compound_name_or_its_prefix_names_it() {
        let fleet = [
            ServerNames {
                name: "google-drive",
                prefix: "gdrive",
                ..Default::default()
            },
            ServerNames {
                name: "atlassian-issues",
                prefix: "jira",
                ..Default::default()
            },
        ];
        assert_eq!(
            named_servers(&fleet, "upload the file to my drive"),
            ["google-drive"]
        );
        assert_eq!(named_servers(&fleet, "gdrive upload"), ["google-drive"]);
        assert_eq!(
            named_servers(&fleet, "create a Jira ticket"),
            ["atlassian-issues"]
        );
    }

    #[test]
    fn category_and_hint_words_name_a_server() {
        let fleet = [
            ServerNames {
                name: "pg",
                prefix: "pg",
                category: Some("database"),
                hint: Some("PostgreSQL analytics warehouse"),
            },
            server("weather"),
        ];
        assert_eq!(named_servers(&fleet, "query the database"), ["pg"]);
        assert_eq!(named_servers(&fleet, "run this on postgresql"), ["pg"]);
        assert_eq!(named_servers(&fleet, "weather in Paris"), ["weather"]);
    }

    #[test]
    fn words_are_matched_after_stemming() {
        let fleet = [server("notes"), server("calendar")];
        assert_eq!(named_servers(&fleet, "add a note"), ["notes"]);
        assert_eq!(named_servers(&fleet, "my calendars"), ["calendar"]);
    }

    #[test]
    fn generic_words_never_name_a_server() {
        let fleet = [
            server("mcp-server-api"),
            server("tools"),
            server("local-service-app-client"),
        ];
        for query in [
            "which mcp server has an api",
            "list tools",
            "a local service app client",
        ] {
            assert!(named_servers(&fleet, query).is_empty(), "{query}");
        }
        // The specific word of a name with generic words still names it.
        assert_eq!(
            named_servers(&[server("slack-mcp-server")], "post to slack"),
            ["slack-mcp-server"]
        );
    }

    #[test]
    fn short_and_numeric_words_never_name_a_server() {
        let fleet = [server("s3"), server("archive-2024"), server("k8s")];
        assert!(named_servers(&fleet, "s3 bucket in 2024").is_empty());
        assert_eq!(named_servers(&fleet, "k8s pods"), ["k8s"]);
    }

    #[test]
    fn a_word_naming_more_than_a_quarter_of_the_servers_does_not_count() {
        let vcs = |name| ServerNames {
            name,
            prefix: name,
            category: Some("forge"),
            hint: None,
        };
        // Eight servers: a word may name at most two of them.
        let mut fleet = vec![vcs("gitlab"), vcs("github"), vcs("gitea")];
        for other in ["slack", "jira", "notion", "figma", "sentry"] {
            fleet.push(server(other));
        }
        assert!(named_servers(&fleet, "forge merge request").is_empty());
        fleet[2].category = None;
        assert_eq!(
            named_servers(&fleet, "forge merge request"),
            ["gitlab", "github"]
        );
        // A word naming a single server counts, even in a fleet of two.
        assert_eq!(
            named_servers(&[server("gitlab"), server("github")], "gitlab"),
            ["gitlab"]
        );
        // ... but not a word both of two servers share.
        let pair = [vcs("gitlab"), vcs("github")];
        assert!(named_servers(&pair, "forge").is_empty());
    }

    #[test]
    fn a_query_of_stop_words_or_an_empty_fleet_names_nothing() {
        assert!(named_servers(&[server("gitlab")], "what is this").is_empty());
        assert!(named_servers(&[], "gitlab").is_empty());
    }

    #[test]
    fn each_server_is_named_once_in_fleet_order() {
        let fleet = [server("jira"), server("gitlab")];
        assert_eq!(
            named_servers(&fleet, "gitlab gitlab jira"),
            ["jira", "gitlab"]
        );
    }
}
