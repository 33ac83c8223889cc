//! `ssl.principal.mapping.rules` (KIP-371): how a client certificate's distinguished name
//! (RFC 2253, `CN=client,OU=test,O=spate`) becomes the name of its `User:` principal.
//!
//! The setting is a list of rules separated by commas or newlines, tried in order:
//! - `RULE:pattern/replacement/` — when the whole name matches `pattern`, the name is
//!   the result of replacing every match of `pattern` in it by `replacement` (`$1` is
//!   the first group); a trailing `L` or `U` lowers or raises its case. `\/` is a
//!   literal `/` in either part.
//! - `DEFAULT` — the distinguished name itself.
//!
//! A name no rule matches has no principal: Kafka refuses such a connection, and so does
//! the broker. The default setting is `DEFAULT`. Patterns are the `regex` crate's, which
//! covers the patterns Kafka's documentation shows (groups, lazy quantifiers, classes)
//! but not Java's lookaround or backreferences; a pattern it cannot compile is refused
//! at start.
//!
//! Written by hand because it is Kafka's own small grammar; the matching is `regex`'s.

use regex::Regex;

/// Parsed `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
enum Rule {
    Default,
    Replace {
        /// The pattern anchored at both ends: Java's `Matcher.matches()`.
        whole: Regex,
        pattern: Regex,
        /// In `regex`'s replacement syntax (`${1}`, `$$`).
        replacement: String,
        case: Case,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

/// Rules may be this long in all: the setting comes from the operator, but a bound keeps
/// a mistaken file from compiling megabytes of patterns.
const mapping_rules_bytes_max: usize = 64 * 1024;

impl PrincipalMapper {
    /// Parse the setting; the error names the rule that is wrong.
    pub fn parse(rules: &str) -> Result<Self, String> {
        if rules.len() > mapping_rules_bytes_max {
            return Err(format!("ssl.principal.mapping.rules is longer than {mapping_rules_bytes_max} bytes"));
        }
        let mut parsed = Vec::new();
        let mut rest = rules.trim_start();
        while !rest.is_empty() {
            let (rule, after) = if let Some(after) = rest.strip_prefix("DEFAULT") {
                (Rule::Default, after)
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                parse_replace(after).map_err(|e| format!("ssl.principal.mapping.rules: {e} in {rest:?}"))?
            } else {
                return Err(format!("ssl.principal.mapping.rules: invalid rule {rest:?} (RULE:... or DEFAULT)"));
            };
            parsed.push(rule);
            let after = after.trim_start_matches([' ', '\t', '\r']);
            rest = match after.chars().next() {
                None => "",
                Some(',' | '\n') => after[1..].trim_start(),
                Some(_) => return Err(format!("ssl.principal.mapping.rules: unexpected {after:?} after a rule")),
            };
        }
        if parsed.is_empty() {
            return Err("ssl.principal.mapping.rules is empty (DEFAULT keeps the distinguished name)".into());
        }
        Ok(PrincipalMapper { rules: parsed })
    }

    /// The principal name of `distinguished_name`: the first rule that matches, or None.
    pub fn name(&self, distinguished_name: &str) -> Option<String> {
        self.rules.iter().find_map(|rule| match rule {
            Rule::Default => Some(distinguished_name.to_string()),
            Rule::Replace { whole, pattern, replacement, case } => {
                if !whole.is_match(distinguished_name) {
                    return None;
                }
                let name = pattern.replace_all(distinguished_name, replacement.as_str()).into_owned();
                Some(match case {
                    Case::Keep => name,
                    Case::Lower => name.to_lowercase(),
                    Case::Upper => name.to_uppercase(),
                })
            }
        })
    }
}

impl Default for PrincipalMapper {
    fn default() -> Self {
        PrincipalMapper { rules: vec![Rule::Default] }
    }
}

/// After `RULE:`: `pattern/replacement/` and an optional `L` or `U`.
fn parse_replace(text: &str) -> Result<(Rule, &str), String> {
    let (pattern, rest) = until_slash(text).ok_or("no '/' after the pattern")?;
    let (replacement, rest) = until_slash(rest).ok_or("no '/' after the replacement")?;
    let (case, rest) = match rest.chars().next() {
        Some('L') => (Case::Lower, &rest[1..]),
        Some('U') => (Case::Upper, &rest[1..]),
        _ => (Case::Keep, rest),
    };
    let compile = |p: &str| Regex::new(p).map_err(|e| format!("bad pattern {pattern:?}: {e}"));
    let whole = compile(&format!("^(?:{pattern})$"))?;
    let pattern_re = compile(&pattern)?;
    let replacement = java_replacement(&replacement)?;
    Ok((Rule::Replace { whole, pattern: pattern_re, replacement, case }, rest))
}

/// The text up to the first '/' not escaped by a backslash, with `\/` made `/` (other
/// escapes are kept for the pattern or replacement), and what follows that '/'.
fn until_slash(text: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '/' => return Some((out, &text[i + 1..])),
            '\\' => match chars.next() {
                Some((_, '/')) => out.push('/'),
                Some((_, next)) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    None
}

/// A Java `Matcher.replaceAll` replacement (`$1` a group, `\x` a literal x) in `regex`'s
/// syntax (`${1}`, `$$`), so that `$1a` stays group 1 then `a`, as in Java.
fn java_replacement(java: &str) -> Result<String, String> {
    let mut out = String::with_capacity(java.len() + 4);
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => return Err("a replacement ends with a lone '\\'".into()),
            },
            '$' => {
                let mut group = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    group.push(*d);
                    chars.next();
                }
                if group.is_empty() {
                    return Err("'$' in a replacement names no group (write \\$ for a dollar)".into());
                }
                out.push_str(&format!("${{{group}}}"));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DN: &str = "CN=client,OU=test,O=spate";

    #[test]
    fn default_keeps_the_distinguished_name() {
        assert_eq!(PrincipalMapper::default().name(DN).as_deref(), Some(DN));
        assert_eq!(PrincipalMapper::parse("DEFAULT").unwrap().name(DN).as_deref(), Some(DN));
    }

    /// The examples of Kafka's documentation (security_authz_ssl) and KIP-371.
    #[test]
    fn rules_apply_in_order_as_kafkas_examples() {
        let rules = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,\n RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,\
                     RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L, DEFAULT";
        let m = PrincipalMapper::parse(rules).unwrap();
        assert_eq!(
            m.name("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown").unwrap(),
            "serviceuser"
        );
        assert_eq!(
            m.name("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown").unwrap(),
            "adminuser@admin"
        );
        assert_eq!(m.name("CN=Client.Example,OU=x").unwrap(), "client.example");
        assert_eq!(m.name("O=nobody").unwrap(), "O=nobody");
    }

    #[test]
    fn a_name_no_rule_matches_has_no_principal() {
        let m = PrincipalMapper::parse("RULE:^CN=(.*?),OU=test.*$/$1/U").unwrap();
        assert_eq!(m.name(DN).unwrap(), "CLIENT");
        // The whole name must match: a match inside it is not enough.
        assert_eq!(m.name("O=x,CN=a,OU=test"), None);
    }

    #[test]
    fn escapes_and_groups_follow_java() {
        // `\/` is a literal slash; `$1a` is group 1 then `a`; `\$` a dollar.
        let m = PrincipalMapper::parse(r"RULE:^CN=([^,]*)\/x,.*$/$1a\$/").unwrap();
        assert_eq!(m.name("CN=bob/x,O=y").unwrap(), "boba$");
    }

    #[test]
    fn bad_rules_are_refused_with_the_rule_named() {
        for bad in ["", "RULE:abc", "RULE:^CN=(.*$/$1/", "SOMETHING", "DEFAULT junk", "RULE:^(.*)$/$/"] {
            assert!(PrincipalMapper::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let e = PrincipalMapper::parse("DEFAULT, RULE:x").unwrap_err();
        assert!(e.contains("RULE:x"), "{e}");
    }
}
