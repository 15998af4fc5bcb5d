//! A lexical pre-check that runs before the Starlark parser: bracket nesting
//! and tokens per logical line.
//!
//! Why: starlark's parser and compiler recurse over the syntax tree, so a
//! pathological file (`[[[[...]]]]` or `1+1+...+1` tens of thousands deep)
//! overflows the stack, which aborts the process instead of failing with a
//! message. Measured with the 256 MiB compile stack: 10,000-deep brackets and
//! 50,000-token chains of any operator parse fine; 50,000-deep brackets do
//! not. The limits below stay far under that, and far over real scenarios.

use crate::error::Diagnostic;

/// Deepest bracket nesting (`(`, `[`, `{`) accepted.
pub(crate) const MAX_BRACKET_DEPTH: usize = 100;
/// Most tokens in one logical line (a statement, brackets joined).
pub(crate) const MAX_LINE_TOKENS: usize = 20_000;

/// The first shape problem of `source`, if any.
pub(crate) fn check(file: &str, source: &str) -> Option<Diagnostic> {
    let mut depth = 0_usize;
    let mut tokens = 0_usize;
    let (mut line, mut column) = (1_u32, 0_u32);
    let mut chars = source.chars().peekable();
    let mut in_word = false;
    let mut continued = false;
    while let Some(c) = chars.next() {
        column += 1;
        let (start_line, start_column) = (line, column);
        let is_word = c.is_alphanumeric() || c == '_';
        if !is_word {
            in_word = false;
        }
        match c {
            '\n' => {
                line += 1;
                column = 0;
                if depth == 0 && !continued {
                    tokens = 0;
                }
                continued = false;
                continue;
            }
            '\\' => {
                continued = true;
                continue;
            }
            '#' => {
                while chars.peek().is_some_and(|&n| n != '\n') {
                    chars.next();
                }
            }
            '"' | '\'' => {
                tokens += 1;
                // Triple quotes: the two next characters are the same quote.
                let mut ahead = chars.clone();
                let triple = ahead.next() == Some(c) && ahead.next() == Some(c);
                if triple {
                    chars.next();
                    chars.next();
                    column += 2;
                }
                let mut run = 0;
                while let Some(s) = chars.next() {
                    column += 1;
                    match s {
                        '\\' => {
                            if chars.next() == Some('\n') {
                                line += 1;
                                column = 0;
                            } else {
                                column += 1;
                            }
                            run = 0;
                        }
                        '\n' => {
                            line += 1;
                            column = 0;
                            run = 0;
                            if !triple {
                                break; // unterminated: the parser will say so
                            }
                        }
                        s if s == c => {
                            run += 1;
                            if !triple || run == 3 {
                                break;
                            }
                        }
                        _ => run = 0,
                    }
                }
            }
            '(' | '[' | '{' => {
                tokens += 1;
                depth += 1;
                if depth > MAX_BRACKET_DEPTH {
                    return Some(Diagnostic::located(
                        file,
                        start_line,
                        start_column,
                        format!(
                            "brackets are nested more than {MAX_BRACKET_DEPTH} deep; split the expression into smaller ones"
                        ),
                    ));
                }
            }
            ')' | ']' | '}' => {
                tokens += 1;
                depth = depth.saturating_sub(1);
            }
            c if c.is_whitespace() => {}
            _ if is_word => {
                if !in_word {
                    tokens += 1;
                }
                in_word = true;
            }
            _ => tokens += 1,
        }
        continued = false;
        if tokens > MAX_LINE_TOKENS {
            return Some(Diagnostic::located(
                file,
                start_line,
                start_column,
                format!(
                    "this statement has more than {MAX_LINE_TOKENS} tokens; split it into smaller ones (build long lists with a loop or a comprehension)"
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_code_passes() {
        let src = "x = [stage(\"2m\", concurrency=c) for c in range(64, 2049, 64)]\n\
                   s = '''a (( [[ {{\n''' + \"[[[\" # ((((\n";
        assert_eq!(check("t.star", src), None);
    }

    #[test]
    fn deep_brackets_are_refused_where_they_get_too_deep() {
        let src = format!("x = 1\ny = {}1{}\n", "[".repeat(200), "]".repeat(200));
        let d = check("t.star", &src).unwrap();
        assert_eq!(
            (d.line, d.column),
            (Some(2), Some(5 + MAX_BRACKET_DEPTH as u32))
        );
        assert!(d.message.contains("nested more than 100 deep"), "{d}");
    }

    #[test]
    fn brackets_inside_strings_and_comments_do_not_count() {
        let src = format!("x = \"{0}\" # {0}\ny = '''{0}\n{0}'''\n", "(".repeat(500));
        assert_eq!(check("t.star", &src), None);
    }

    #[test]
    fn overlong_statements_are_refused_but_lines_reset() {
        let long = format!("x = {}\n", vec!["1"; 20_001].join("+"));
        let d = check("t.star", &long).unwrap();
        assert!(d.message.contains("more than 20000 tokens"), "{d}");
        let many_lines = "x = 1 + 1\n".repeat(10_000);
        assert_eq!(check("t.star", &many_lines), None);
        // A statement continued inside brackets counts as one line.
        let bracketed = format!("x = [\n{}]\n", "1,\n".repeat(10_001));
        assert!(check("t.star", &bracketed).is_some());
    }
}
