//! Splits query text into tokens, each with its 1-based column.

use super::{QueryError, QueryErrorKind};

/// A token and where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) kind: TokenKind,
    /// 1-based column (in characters) of the token's first character.
    pub(crate) column: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// A field name, a value, or the words `in` / `notin`.
    Word(String),
    /// `=`, `!=`, `<`, `<=`, `>`, `>=`.
    Op(CompareOp),
    LBracket,
    RBracket,
    Comma,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `in [..]`
    In,
    /// `notin [..]`
    NotIn,
}

impl CompareOp {
    /// How the operator is written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "!=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::In => "in",
            Self::NotIn => "notin",
        }
    }
}

fn is_word_char(c: char) -> bool {
    // `/`, `*` and `@` for image references (`nvcr.io/nvidia/pytorch:24.01`, `pytorch*`,
    // `name@sha256:...`).
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':' | '+' | '/' | '*' | '@')
}

pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, QueryError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        let mut push = |kind, width: usize| {
            tokens.push(Token { kind, column });
            width
        };
        i += match c {
            c if c.is_whitespace() => 1,
            '[' => push(TokenKind::LBracket, 1),
            ']' => push(TokenKind::RBracket, 1),
            ',' => push(TokenKind::Comma, 1),
            '=' => push(TokenKind::Op(CompareOp::Eq), 1),
            '!' if chars.get(i + 1) == Some(&'=') => push(TokenKind::Op(CompareOp::Ne), 2),
            '<' if chars.get(i + 1) == Some(&'=') => push(TokenKind::Op(CompareOp::Le), 2),
            '>' if chars.get(i + 1) == Some(&'=') => push(TokenKind::Op(CompareOp::Ge), 2),
            '<' => push(TokenKind::Op(CompareOp::Lt), 1),
            '>' => push(TokenKind::Op(CompareOp::Gt), 1),
            c if is_word_char(c) => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| !is_word_char(c))
                    .map_or(chars.len(), |n| i + n);
                let word: String = chars[i..end].iter().collect();
                push(TokenKind::Word(word), end - i)
            }
            other => {
                return Err(QueryError {
                    column,
                    kind: QueryErrorKind::UnexpectedChar(other),
                });
            }
        };
    }
    Ok(tokens)
}
