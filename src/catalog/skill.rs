//! Skills (Skills-over-MCP): a child's `skill://<path>/SKILL.md` resources, described by the
//! front matter of each SKILL.md.
//!
//! A skill is a catalog family like tools and resources: the probe lists the child's resources,
//! reads every one whose URI is a SKILL.md ([`is_skill_uri`]) within its bounds, and keeps what
//! [`parse_front_matter`] reads from it. The body is not kept: a client reads it through the
//! gateway's `resources/read` of the skill's URI.
//!
//! The front matter parser is deliberately small and tolerant rather than a YAML parser: only the
//! top-level `name:` and `description:` scalars matter, real SKILL.md files often carry values
//! that strict YAML refuses (an unquoted `: ` inside a description), and a value is always text
//! (`name: yes` is the string `yes`, never a boolean).

use serde::Serialize;

/// The URI scheme of skills.
pub const SKILL_SCHEME: &str = "skill://";

/// The file name that makes a `skill://` resource a skill.
pub const SKILL_FILE: &str = "SKILL.md";

/// Longest accepted skill name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Longest accepted skill description, in bytes (the Agent Skills format allows 1024
/// characters; four times that in bytes leaves room for any script).
pub const MAX_DESCRIPTION_BYTES: usize = 4096;

/// One skill a child serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Skill {
    /// The SKILL.md resource (`skill://<path>/SKILL.md`); read it with `resources/read`.
    pub uri: String,
    /// `name:` of the front matter (the URI's skill path when the front matter has none).
    pub name: String,
    /// `description:` of the front matter.
    pub description: String,
}

/// Why a SKILL.md yields no skill. Every variant has a stable [`SkillError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkillError {
    /// The document is larger than the probe's per-skill bound.
    #[error("SKILL.md is larger than {0} bytes")]
    TooLarge(usize),
    /// The document does not start with a `---` line.
    #[error("SKILL.md has no front matter (it must start with a `---` line)")]
    NoFrontMatter,
    /// No closing `---` line.
    #[error("SKILL.md front matter is not closed by a `---` line")]
    Unterminated,
    /// No usable name (neither `name:` nor a skill path in the URI).
    #[error("SKILL.md front matter has no name")]
    MissingName,
    /// No (or an empty) `description:`.
    #[error("SKILL.md front matter has no description")]
    MissingDescription,
    /// The name is too long or contains control characters.
    #[error("skill name must be 1..{MAX_NAME_BYTES} bytes without control characters")]
    InvalidName,
    /// The description is longer than [`MAX_DESCRIPTION_BYTES`].
    #[error("skill description is longer than {MAX_DESCRIPTION_BYTES} bytes")]
    DescriptionTooLong,
}

impl SkillError {
    /// Stable reason code (logged when a skill is left out).
    pub fn code(&self) -> &'static str {
        match self {
            SkillError::TooLarge(_) => "skill-too-large",
            SkillError::NoFrontMatter => "skill-no-front-matter",
            SkillError::Unterminated => "skill-front-matter-unterminated",
            SkillError::MissingName => "skill-missing-name",
            SkillError::MissingDescription => "skill-missing-description",
            SkillError::InvalidName => "skill-name-invalid",
            SkillError::DescriptionTooLong => "skill-description-too-long",
        }
    }
}

/// The skill path of a SKILL.md URI: `skill://<path>/SKILL.md` with a non-empty path of
/// non-empty segments (`skill://pdf/SKILL.md` → `pdf`, `skill://acme/billing/SKILL.md` →
/// `acme/billing`); `None` for any other URI.
pub fn skill_path(uri: &str) -> Option<&str> {
    let path = uri
        .strip_prefix(SKILL_SCHEME)?
        .strip_suffix(SKILL_FILE)?
        .strip_suffix('/')?;
    let valid = !path.is_empty()
        && path.split('/').all(|s| !s.is_empty())
        && !path.contains(['?', '#'])
        && !path.chars().any(char::is_control);
    valid.then_some(path)
}

/// Whether a resource URI is a skill (`skill://<path>/SKILL.md`).
pub fn is_skill_uri(uri: &str) -> bool {
    skill_path(uri).is_some()
}

/// Reads the skill of `uri` from its SKILL.md `text`, which may be at most `max_bytes` long.
pub fn parse_skill(uri: &str, text: &str, max_bytes: usize) -> Result<Skill, SkillError> {
    let meta = parse_front_matter(text, max_bytes)?;
    let name = match meta.name {
        Some(n) => n,
        None => skill_path(uri)
            .and_then(|p| p.rsplit('/').next())
            .map(str::to_string)
            .ok_or(SkillError::MissingName)?,
    };
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(SkillError::InvalidName);
    }
    let description = meta.description.ok_or(SkillError::MissingDescription)?;
    if description.len() > MAX_DESCRIPTION_BYTES {
        return Err(SkillError::DescriptionTooLong);
    }
    Ok(Skill {
        uri: uri.to_string(),
        name,
        description,
    })
}

/// The `name:` and `description:` of a front matter (each `None` when absent or empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontMatter {
    /// `name:`.
    pub name: Option<String>,
    /// `description:`.
    pub description: Option<String>,
}

/// Parses the front matter of a SKILL.md: a first line `---`, then `key: value` lines, then a
/// line `---` (or `...`). Accepts LF and CRLF line ends and a leading byte-order mark.
///
/// Values are plain (continued on more-indented lines, folded with spaces; ` #` starts a
/// comment), `'single'` or `"double"` quoted (with `\"`, `\\`, `\n`, `\t` and `\uXXXX`
/// escapes), or block scalars (`|` keeps line breaks, `>` folds them; chomping indicators are
/// accepted and trailing breaks dropped). Indented lines under any other key (nested maps such
/// as `metadata:`) are skipped. When a key repeats, the first value counts.
pub fn parse_front_matter(text: &str, max_bytes: usize) -> Result<FrontMatter, SkillError> {
    if text.len() > max_bytes {
        return Err(SkillError::TooLarge(max_bytes));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(SkillError::NoFrontMatter);
    }
    let mut block = Vec::new();
    let mut closed = false;
    for line in lines {
        let t = line.trim_end();
        if t == "---" || t == "..." {
            closed = true;
            break;
        }
        block.push(line);
    }
    if !closed {
        return Err(SkillError::Unterminated);
    }
    let mut out = FrontMatter::default();
    let mut i = 0;
    while i < block.len() {
        let line = block[i];
        i += 1;
        let Some((key, rest)) = top_level_key(line) else {
            continue;
        };
        // Lines belonging to this key: more indented ones, and blank ones between them.
        let start = i;
        while i < block.len() && (block[i].trim().is_empty() || indented(block[i])) {
            i += 1;
        }
        let continuation = &block[start..i];
        let slot = match key {
            "name" => &mut out.name,
            "description" => &mut out.description,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(scalar(rest, continuation)).filter(|v| !v.is_empty());
        }
    }
    Ok(out)
}

fn indented(line: &str) -> bool {
    line.starts_with([' ', '\t'])
}

/// `key: rest` of a line at column 0 (keys are letters, digits, `_`, `-` and `.`).
fn top_level_key(line: &str) -> Option<(&str, &str)> {
    if indented(line) || line.starts_with('#') {
        return None;
    }
    let (key, rest) = line.split_once(':')?;
    let key = key.trim_end();
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    (ok && (rest.is_empty() || rest.starts_with([' ', '\t']))).then_some((key, rest.trim()))
}

/// The text value of a key whose line holds `rest` and whose more-indented lines are `more`.
fn scalar(rest: &str, more: &[&str]) -> String {
    if let Some(indicator) = rest.strip_prefix(['|', '>']) {
        let header = indicator.split(" #").next().unwrap_or_default().trim();
        if header
            .chars()
            .all(|c| matches!(c, '-' | '+') || c.is_ascii_digit())
        {
            return block_scalar(rest.starts_with('|'), more);
        }
    }
    if let Some(body) = rest.strip_prefix('"') {
        return double_quoted(body);
    }
    if let Some(body) = rest.strip_prefix('\'') {
        let end = single_quote_end(body).unwrap_or(body.len());
        return body[..end].replace("''", "'");
    }
    let mut parts = vec![strip_comment(rest)];
    parts.extend(
        more.iter()
            .map(|l| strip_comment(l.trim()))
            .filter(|l| !l.is_empty()),
    );
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn strip_comment(s: &str) -> &str {
    if s.starts_with('#') {
        return "";
    }
    s.split(" #").next().unwrap_or_default().trim()
}

/// The end of a single-quoted body (`''` is an escaped quote).
fn single_quote_end(body: &str) -> Option<usize> {
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\'' {
            if bytes.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            return Some(i);
        }
        i += 1;
    }
    None
}

fn double_quoted(body: &str) -> String {
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    if let Some(ch) = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                        out.push(ch);
                    }
                }
                Some(other) => out.push(other),
                None => break,
            },
            c => out.push(c),
        }
    }
    out.trim().to_string()
}

/// A `|` (literal) or `>` (folded) block: the common indentation removed, trailing breaks
/// dropped.
fn block_scalar(literal: bool, lines: &[&str]) -> String {
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let body: Vec<&str> = lines
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                ""
            } else {
                &l[indent..]
            }
        })
        .collect();
    let text = if literal {
        body.join("\n")
    } else {
        let mut out = String::new();
        for line in body {
            if line.is_empty() {
                out.push('\n');
            } else {
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push(' ');
                }
                out.push_str(line.trim_end());
            }
        }
        out
    };
    text.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 64 * 1024;

    fn skill(text: &str) -> Result<Skill, SkillError> {
        parse_skill("skill://pdf-forms/SKILL.md", text, MAX)
    }

    #[test]
    fn a_well_formed_skill_md_gives_its_name_and_description() {
        let s = skill(
            "---\nname: pdf-forms\ndescription: Fill in PDF forms and flatten them.\nlicense: MIT\n---\n# PDF forms\nbody\n",
        )
        .unwrap();
        assert_eq!(s.uri, "skill://pdf-forms/SKILL.md");
        assert_eq!(s.name, "pdf-forms");
        assert_eq!(s.description, "Fill in PDF forms and flatten them.");
    }

    #[test]
    fn crlf_line_ends_and_a_byte_order_mark_are_accepted() {
        let s = skill("\u{feff}---\r\nname: pdf-forms\r\ndescription: Fill forms\r\n---\r\nbody")
            .unwrap();
        assert_eq!(
            (s.name.as_str(), s.description.as_str()),
            ("pdf-forms", "Fill forms")
        );
    }

    #[test]
    fn a_missing_description_yields_no_skill() {
        assert_eq!(
            skill("---\nname: pdf-forms\n---\nbody"),
            Err(SkillError::MissingDescription)
        );
        assert_eq!(
            skill("---\nname: pdf-forms\ndescription:\n---\n")
                .unwrap_err()
                .code(),
            "skill-missing-description"
        );
    }

    #[test]
    fn a_missing_name_falls_back_to_the_skill_path_of_the_uri() {
        let s = parse_skill(
            "skill://acme/billing-refunds/SKILL.md",
            "---\ndescription: Refund an invoice\n---\n",
            MAX,
        )
        .unwrap();
        assert_eq!(s.name, "billing-refunds");
    }

    #[test]
    fn a_document_without_front_matter_yields_no_skill() {
        assert_eq!(skill("# Just markdown\n"), Err(SkillError::NoFrontMatter));
        assert_eq!(skill(""), Err(SkillError::NoFrontMatter));
        assert_eq!(
            skill("---\nname: x\ndescription: y\n"),
            Err(SkillError::Unterminated)
        );
    }

    #[test]
    fn an_oversized_document_is_refused_before_parsing() {
        let big = format!("---\nname: x\ndescription: y\n---\n{}", "a".repeat(MAX));
        assert_eq!(
            parse_skill("skill://x/SKILL.md", &big, MAX),
            Err(SkillError::TooLarge(MAX))
        );
        let long = format!("---\nname: x\ndescription: {}\n---\n", "d".repeat(5000));
        assert_eq!(skill(&long), Err(SkillError::DescriptionTooLong));
        let control = "---\nname: a\u{7}b\ndescription: y\n---\n";
        assert_eq!(skill(control), Err(SkillError::InvalidName));
    }

    #[test]
    fn values_that_strict_yaml_refuses_or_retypes_are_read_as_text() {
        let s =
            skill("---\nname: yes\ndescription: Use when: the user asks for forms # note\n---\n")
                .unwrap();
        assert_eq!(s.name, "yes");
        assert_eq!(s.description, "Use when: the user asks for forms");
    }

    #[test]
    fn quoted_block_and_continued_values_are_unfolded() {
        let fm = parse_front_matter(
            "---\nname: 'it''s'\ndescription: \"Fill \\\"forms\\\"\\tnow\"\n---\n",
            MAX,
        )
        .unwrap();
        assert_eq!(fm.name.as_deref(), Some("it's"));
        assert_eq!(fm.description.as_deref(), Some("Fill \"forms\"\tnow"));
        let folded = parse_front_matter(
            "---\ndescription: >-\n  Fill PDF forms\n  and flatten them.\n\n  Second paragraph.\nname: x\n---\n",
            MAX,
        )
        .unwrap();
        assert_eq!(
            folded.description.as_deref(),
            Some("Fill PDF forms and flatten them.\nSecond paragraph.")
        );
        let literal =
            parse_front_matter("---\ndescription: |\n  line one\n  line two\n---\n", MAX).unwrap();
        assert_eq!(literal.description.as_deref(), Some("line one\nline two"));
        let plain = parse_front_matter(
            "---\ndescription: Fill PDF forms\n  and flatten them\nname: x\n---\n",
            MAX,
        )
        .unwrap();
        assert_eq!(
            plain.description.as_deref(),
            Some("Fill PDF forms and flatten them")
        );
    }

    #[test]
    fn nested_maps_comments_and_repeated_keys_do_not_confuse_the_top_level() {
        let fm = parse_front_matter(
            "---\n# a comment\nmetadata:\n  name: nested\n  description: nested too\nname: top\ndescription: first\ndescription: second\n---\n",
            MAX,
        )
        .unwrap();
        assert_eq!(fm.name.as_deref(), Some("top"));
        assert_eq!(fm.description.as_deref(), Some("first"));
    }

    #[test]
    fn only_skill_md_resources_of_the_skill_scheme_are_skills() {
        assert_eq!(skill_path("skill://pdf/SKILL.md"), Some("pdf"));
        assert_eq!(
            skill_path("skill://acme/billing/SKILL.md"),
            Some("acme/billing")
        );
        for not in [
            "skill://SKILL.md",
            "skill:///SKILL.md",
            "skill://a//SKILL.md",
            "skill://pdf/README.md",
            "skill://pdf/skill.md",
            "file://pdf/SKILL.md",
            "skill://pdf/references/SKILL.md.bak",
            "skill://pdf?x=1/SKILL.md",
        ] {
            assert!(!is_skill_uri(not), "{not}");
        }
    }
}
