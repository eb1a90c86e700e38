//! Lexical analysis for the BM25F signal: word splitting (separators, camelCase humps and
//! acronyms), lowercasing, stop words and the Porter stemmer.
//!
//! The Porter stemmer (M. F. Porter, "An algorithm for suffix stripping", 1980) is written here
//! rather than pulled from a crate: it is ~150 lines, it only has to be applied identically to
//! documents and queries, and it replaces the old plural-only folding, which the benchmark showed
//! missing paraphrases (`forecasting`/`forecast`, `translation`/`translate`).

/// Words that carry no retrieval signal in tool queries and descriptions. Verbs that name tool
/// actions (`get`, `find`, `list`, `show`, `search`) are deliberately kept.
const STOP: &[&str] = &[
    "a", "about", "d", "ll", "m", "re", "s", "t", "ve", "all", "also", "am", "an", "and", "any",
    "are", "as", "at", "be", "been", "but", "by", "can", "could", "do", "does", "for", "from",
    "had", "has", "have", "he", "her", "here", "him", "his", "how", "i", "if", "im", "in", "into",
    "is", "it", "its", "just", "let", "me", "my", "need", "of", "on", "or", "our", "please", "she",
    "should", "so", "some", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "those", "to", "us", "use", "using", "want", "was", "we", "were", "what", "when",
    "which", "who", "will", "with", "would", "you", "your",
];

/// Lowercased, stemmed word tokens with stop words removed.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in words(text) {
        let lower = word.to_lowercase();
        if STOP.contains(&lower.as_str()) {
            continue;
        }
        out.push(stem(&lower));
    }
    out
}

/// Splits on non-alphanumerics, camelCase humps (`getSum` → `get Sum`) and acronym ends
/// (`HTTPServer` → `HTTP Server`). Contraction fragments (`I'm` → `I`, `m`) are stop words.
pub fn words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut start: Option<usize> = None;
    for (i, &(pos, c)) in chars.iter().enumerate() {
        if c.is_alphanumeric() {
            match start {
                None => start = Some(pos),
                Some(s) => {
                    let prev = chars[i - 1].1;
                    let next_lower = chars.get(i + 1).is_some_and(|(_, n)| n.is_lowercase());
                    let hump = c.is_uppercase()
                        && (prev.is_lowercase()
                            || prev.is_ascii_digit()
                            || (prev.is_uppercase() && next_lower));
                    if hump {
                        out.push(&text[s..pos]);
                        start = Some(pos);
                    }
                }
            }
        } else if let Some(s) = start.take() {
            out.push(&text[s..pos]);
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

/// Words of an identifier joined by spaces (`gh__create_pull_request` → `gh create pull request`).
pub fn spaced(name: &str) -> String {
    words(name).join(" ")
}

/// Porter stem of a lowercase word; words that are not plain ASCII letters (or are shorter
/// than three letters) are returned unchanged.
pub fn stem(word: &str) -> String {
    if word.len() <= 2 || !word.bytes().all(|b| b.is_ascii_lowercase()) {
        return word.to_string();
    }
    let mut w = word.as_bytes().to_vec();
    step1ab(&mut w);
    step1c(&mut w);
    step2(&mut w);
    step3(&mut w);
    step4(&mut w);
    step5(&mut w);
    String::from_utf8(w).unwrap_or_else(|_| word.to_string())
}

fn is_cons(w: &[u8], i: usize) -> bool {
    match w[i] {
        b'a' | b'e' | b'i' | b'o' | b'u' => false,
        b'y' => i == 0 || !is_cons(w, i - 1),
        _ => true,
    }
}

/// Number of vowel-consonant sequences in `w[..len]`.
fn measure(w: &[u8], len: usize) -> usize {
    let mut m = 0;
    let mut i = 0;
    while i < len && is_cons(w, i) {
        i += 1;
    }
    loop {
        while i < len && !is_cons(w, i) {
            i += 1;
        }
        if i >= len {
            return m;
        }
        while i < len && is_cons(w, i) {
            i += 1;
        }
        m += 1;
    }
}

fn has_vowel(w: &[u8], len: usize) -> bool {
    (0..len).any(|i| !is_cons(w, i))
}

fn double_cons(w: &[u8], len: usize) -> bool {
    len >= 2 && w[len - 1] == w[len - 2] && is_cons(w, len - 1)
}

/// consonant-vowel-consonant ending, the last not w, x or y.
fn cvc(w: &[u8], len: usize) -> bool {
    len >= 3
        && is_cons(w, len - 1)
        && !is_cons(w, len - 2)
        && is_cons(w, len - 3)
        && !matches!(w[len - 1], b'w' | b'x' | b'y')
}

fn ends(w: &[u8], s: &str) -> bool {
    w.ends_with(s.as_bytes())
}

fn set_to(w: &mut Vec<u8>, suffix_len: usize, rep: &str) {
    w.truncate(w.len() - suffix_len);
    w.extend_from_slice(rep.as_bytes());
}

/// Replaces `suffix` by `rep` when the stem before it has measure > `min_m`; true if it matched.
fn replace_if(w: &mut Vec<u8>, suffix: &str, rep: &str, min_m: usize) -> bool {
    if !ends(w, suffix) {
        return false;
    }
    let stem_len = w.len() - suffix.len();
    if measure(w, stem_len) > min_m {
        set_to(w, suffix.len(), rep);
    }
    true
}

fn step1ab(w: &mut Vec<u8>) {
    if ends(w, "sses") {
        set_to(w, 4, "ss");
    } else if ends(w, "ies") {
        set_to(w, 3, "i");
    } else if !ends(w, "ss") && ends(w, "s") {
        set_to(w, 1, "");
    }
    if ends(w, "eed") {
        if measure(w, w.len() - 3) > 0 {
            set_to(w, 3, "ee");
        }
        return;
    }
    let cut = if ends(w, "ed") && has_vowel(w, w.len() - 2) {
        2
    } else if ends(w, "ing") && has_vowel(w, w.len() - 3) {
        3
    } else {
        return;
    };
    set_to(w, cut, "");
    if ends(w, "at") || ends(w, "bl") || ends(w, "iz") {
        w.push(b'e');
    } else if double_cons(w, w.len()) && !matches!(w[w.len() - 1], b'l' | b's' | b'z') {
        w.pop();
    } else if measure(w, w.len()) == 1 && cvc(w, w.len()) {
        w.push(b'e');
    }
}

fn step1c(w: &mut [u8]) {
    let n = w.len();
    if n > 1 && w[n - 1] == b'y' && has_vowel(w, n - 1) {
        w[n - 1] = b'i';
    }
}

fn step2(w: &mut Vec<u8>) {
    const RULES: &[(&str, &str)] = &[
        ("ational", "ate"),
        ("tional", "tion"),
        ("enci", "ence"),
        ("anci", "ance"),
        ("izer", "ize"),
        ("bli", "ble"),
        ("alli", "al"),
        ("entli", "ent"),
        ("eli", "e"),
        ("ousli", "ous"),
        ("ization", "ize"),
        ("ation", "ate"),
        ("ator", "ate"),
        ("alism", "al"),
        ("iveness", "ive"),
        ("fulness", "ful"),
        ("ousness", "ous"),
        ("aliti", "al"),
        ("iviti", "ive"),
        ("biliti", "ble"),
        ("logi", "log"),
    ];
    for (s, r) in RULES {
        if replace_if(w, s, r, 0) {
            return;
        }
    }
}

fn step3(w: &mut Vec<u8>) {
    const RULES: &[(&str, &str)] = &[
        ("icate", "ic"),
        ("ative", ""),
        ("alize", "al"),
        ("iciti", "ic"),
        ("ical", "ic"),
        ("ful", ""),
        ("ness", ""),
    ];
    for (s, r) in RULES {
        if replace_if(w, s, r, 0) {
            return;
        }
    }
}

fn step4(w: &mut Vec<u8>) {
    const SUFFIXES: &[&str] = &[
        "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion",
        "ou", "ism", "ate", "iti", "ous", "ive", "ize",
    ];
    // Longest suffix first among those that match (`ement` before `ment` before `ent`).
    let Some(s) = SUFFIXES
        .iter()
        .filter(|s| ends(w, s))
        .max_by_key(|s| s.len())
    else {
        return;
    };
    let stem_len = w.len() - s.len();
    if measure(w, stem_len) <= 1 {
        return;
    }
    if *s == "ion" && !(stem_len > 0 && matches!(w[stem_len - 1], b's' | b't')) {
        return;
    }
    w.truncate(stem_len);
}

fn step5(w: &mut Vec<u8>) {
    let n = w.len();
    if w[n - 1] == b'e' {
        let m = measure(w, n - 1);
        if m > 1 || (m == 1 && !cvc(w, n - 1)) {
            w.pop();
        }
    }
    let n = w.len();
    if n > 1 && w[n - 1] == b'l' && double_cons(w, n) && measure(w, n) > 1 {
        w.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_humps_acronyms_and_separators() {
        assert_eq!(
            words("getSum HTTPServer ev__get-tiny-image v2Api"),
            vec![
                "get", "Sum", "HTTP", "Server", "ev", "get", "tiny", "image", "v2", "Api"
            ]
        );
        assert_eq!(spaced("gh__create_pull_request"), "gh create pull request");
    }

    #[test]
    fn porter_reference_words() {
        for (w, s) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("hopping", "hop"),
            ("filing", "file"),
            ("happy", "happi"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("generalization", "gener"),
            ("forecasting", "forecast"),
            ("translation", "translat"),
            ("translate", "translat"),
            ("numbers", "number"),
            ("adjustment", "adjust"),
        ] {
            assert_eq!(stem(w), s, "{w}");
        }
    }

    #[test]
    fn tokenizer_drops_stop_words_and_stems() {
        assert_eq!(tokenize("getSum of Numbers"), vec!["get", "sum", "number"]);
        assert_eq!(
            tokenize("Can you tell me the weather forecasts?"),
            vec!["tell", "weather", "forecast"]
        );
    }
}
