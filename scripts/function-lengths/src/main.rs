//! `longest-functions`: the length of every product function of the
//! workspace, read with a Rust parser (`syn`), so that no pattern in a
//! signature or brace in a string can hide one.
//!
//! ```text
//! longest-functions [N]           the N longest (default 15)
//! longest-functions --max LINES   every function over LINES; exit 1 if any
//! ```
//!
//! A function's length is the lines from its first line after the
//! attributes (`pub`, `async` or `fn`) to its closing brace. Free
//! functions, methods, trait methods with a body and functions nested in
//! others all count; closures count toward the function they are in. Only
//! the workspace's packages are read, and of them only product code: items
//! under a `cfg` that needs `test` (`#[cfg(test)]`, `#[cfg(all(test, ...))]`),
//! `#[test]` and `#[tokio::test]` functions, files a `#[cfg(test)] mod`
//! declares, the test harness crate (`tests/`), each crate's `tests/` and
//! `benches/`, and this tool itself are left out. Functions inside
//! `macro_rules!` bodies are not seen (they are tokens, not items). A file
//! that does not parse is an error (exit 2).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use syn::visit::{self, Visit};

/// One function with a body.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Function {
    lines: usize,
    /// `Type::method` for a method of a type named by a path, else the name.
    name: String,
    /// Where its `fn` line is: `<path>:<line>`.
    place: String,
}

/// What to print.
enum Mode {
    Longest(usize),
    Over(usize),
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("longest-functions: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let mode = mode(std::env::args().skip(1).collect())?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().context("the workspace root")?;
    let own = Path::new(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .context("this tool's crate")?;
    let mut found = Vec::new();
    for file in product_files(&root, &own)? {
        let place = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {place}"))?;
        found.extend(functions(&text, &place)?);
    }
    found.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.place.cmp(&b.place)));
    Ok(match mode {
        Mode::Longest(count) => {
            found.iter().take(count).for_each(print);
            ExitCode::SUCCESS
        }
        Mode::Over(limit) => {
            let over: Vec<&Function> = found.iter().filter(|f| f.lines > limit).collect();
            if over.is_empty() {
                println!("no function over {limit} lines");
                ExitCode::SUCCESS
            } else {
                println!(
                    "{} functions over {limit} lines (tests excepted):",
                    over.len()
                );
                over.into_iter().for_each(print);
                ExitCode::FAILURE
            }
        }
    })
}

fn print(function: &Function) {
    println!(
        "{:5}  {:32} {}",
        function.lines, function.name, function.place
    );
}

fn mode(args: Vec<String>) -> anyhow::Result<Mode> {
    let number = |text: &str| {
        text.parse::<usize>()
            .with_context(|| format!("{text:?} is not a number of lines"))
    };
    match args.as_slice() {
        [] => Ok(Mode::Longest(15)),
        [flag, limit] if flag == "--max" => Ok(Mode::Over(number(limit)?)),
        [count] if !count.starts_with('-') => Ok(Mode::Longest(number(count)?)),
        _ => bail!("usage: longest-functions [N] | --max LINES"),
    }
}

/// Every `.rs` file of the workspace's product code: in a package's
/// directory (one whose `Cargo.toml` has a `[package]`), outside the
/// skipped directories, the crate `own` (this tool) and anything a
/// `#[cfg(test)] mod` declares.
fn product_files(root: &Path, own: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    walk(root, own, false, &mut files)?;
    let tests_only: BTreeSet<PathBuf> = files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file)?;
            Ok(test_module_files(file, &text))
        })
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    files.retain(|file| !tests_only.contains(file));
    files.sort();
    Ok(files)
}

/// Directories that hold no product code: build output, the tools the
/// scripts install, version control, tests (the harness crate with the fuzz
/// targets, and each crate's integration tests) and benchmarks.
const SKIPPED_DIRS: [&str; 6] = [
    "target",
    ".tools",
    ".git",
    "tests",
    "benches",
    "node_modules",
];

/// Collects the `.rs` files under `dir` that belong to a package:
/// `in_package` once a directory above it is one.
fn walk(dir: &Path, own: &Path, in_package: bool, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if dir == own {
        return Ok(());
    }
    let in_package = in_package || is_package(dir)?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&name) {
                walk(&path, own, in_package, files)?;
            }
        } else if in_package && name.ends_with(".rs") {
            files.push(path);
        }
    }
    Ok(())
}

/// Whether `dir` holds a package's `Cargo.toml` (not the workspace's
/// virtual manifest).
fn is_package(dir: &Path) -> anyhow::Result<bool> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        return Ok(false);
    }
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    Ok(text.lines().any(|line| line.trim() == "[package]"))
}

/// The files of the modules `text` (the file `file`) declares under
/// `#[cfg(test)]` without a body, at its top level or in inline modules:
/// `mod tests;` is `tests.rs` (or `tests/mod.rs`) beside a `mod.rs`,
/// `lib.rs` or `main.rs`, else in the directory named after the file.
fn test_module_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let Ok(parsed) = syn::parse_file(text) else {
        return Vec::new();
    };
    let dir = file.parent().unwrap_or(Path::new("."));
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let base = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let mut files = Vec::new();
    declared_test_files(&parsed.items, &base, &mut files);
    files
}

/// Adds the files of the `#[cfg(test)]` modules `items` declare, whose
/// files are found under `base`, and of those their inline modules declare.
fn declared_test_files(items: &[syn::Item], base: &Path, files: &mut Vec<PathBuf>) {
    for item in items {
        let syn::Item::Mod(module) = item else {
            continue;
        };
        let name = module.ident.to_string();
        match &module.content {
            None if is_test_only(&module.attrs) => {
                files.push(base.join(format!("{name}.rs")));
                files.push(base.join(name).join("mod.rs"));
            }
            Some((_, inner)) if !is_test_only(&module.attrs) => {
                declared_test_files(inner, &base.join(name), files);
            }
            _ => {}
        }
    }
}

/// Every function with a body in `text`, outside tests; `place` names the
/// file.
fn functions(text: &str, place: &str) -> anyhow::Result<Vec<Function>> {
    let file = syn::parse_file(text).with_context(|| format!("{place} does not parse"))?;
    let mut finder = Finder {
        place,
        self_type: None,
        found: Vec::new(),
    };
    finder.visit_file(&file);
    Ok(finder.found)
}

/// Whether `attrs` make an item test-only: `#[test]` (any path ending in
/// `test`, such as `tokio::test`) or a `cfg` that holds only under `test`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        if path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        path.is_ident("cfg")
            && attr.meta.require_list().is_ok_and(|list| {
                predicates(list.tokens.clone())
                    .iter()
                    .any(|p| needs_test(p))
            })
    })
}

/// A `cfg` list's predicates, split at its commas.
fn predicates(tokens: proc_macro2::TokenStream) -> Vec<Vec<proc_macro2::TokenTree>> {
    let mut split = vec![Vec::new()];
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Punct(punct) if punct.as_char() == ',' => {
                split.push(Vec::new())
            }
            token => split.last_mut().expect("starts with one").push(token),
        }
    }
    split.retain(|predicate| !predicate.is_empty());
    split
}

/// Whether a `cfg` predicate holds only under `test`: `test`, an `all` with
/// such a part, an `any` of only such parts; never a `not`.
fn needs_test(predicate: &[proc_macro2::TokenTree]) -> bool {
    use proc_macro2::TokenTree::{Group, Ident};
    match predicate {
        [Ident(ident)] => ident == "test",
        [Ident(ident), Group(group)] if ident == "all" => {
            predicates(group.stream()).iter().any(|p| needs_test(p))
        }
        [Ident(ident), Group(group)] if ident == "any" => {
            let parts = predicates(group.stream());
            !parts.is_empty() && parts.iter().all(|p| needs_test(p))
        }
        _ => false,
    }
}

/// The line a function starts on: its visibility or first qualifier
/// (`default`, `const`, `async`, `unsafe`, `extern`), else its `fn`.
fn first_line(
    vis: Option<&syn::Visibility>,
    modifiers: &syn::FnModifiers,
    sig: &syn::Signature,
) -> usize {
    let vis = vis.and_then(|vis| match vis {
        syn::Visibility::Public(token) => Some(token.span),
        syn::Visibility::Restricted(restricted) => Some(restricted.pub_token.span),
        syn::Visibility::Inherited => None,
    });
    let safety = match &sig.safety {
        syn::Safety::Safe(token) => Some(token.span),
        syn::Safety::Unsafe(token) => Some(token.span),
        syn::Safety::Default => None,
    };
    [
        vis,
        modifiers.defaultness.as_ref().map(|token| token.span),
        sig.constness.as_ref().map(|token| token.span),
        sig.asyncness.as_ref().map(|token| token.span),
        safety,
        sig.abi.as_ref().map(|abi| abi.extern_token.span),
    ]
    .into_iter()
    .flatten()
    .next()
    .unwrap_or(sig.fn_token.span)
    .start()
    .line
}

struct Finder<'a> {
    place: &'a str,
    /// The type of the `impl` block being read, when it is a path.
    self_type: Option<String>,
    found: Vec<Function>,
}

impl Finder<'_> {
    fn record(&mut self, name: String, start: usize, block: &syn::Block) {
        let end = block.brace_token.span.close().end().line;
        self.found.push(Function {
            lines: end + 1 - start,
            name,
            place: format!("{}:{start}", self.place),
        });
    }

    fn method_name(&self, ident: &syn::Ident) -> String {
        match &self.self_type {
            Some(owner) => format!("{owner}::{ident}"),
            None => ident.to_string(),
        }
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if !is_test_only(&module.attrs) {
            visit::visit_item_mod(self, module);
        }
    }

    fn visit_item_fn(&mut self, function: &'ast syn::ItemFn) {
        if is_test_only(&function.attrs) {
            return;
        }
        let start = first_line(Some(&function.vis), &function.modifiers, &function.sig);
        self.record(function.sig.ident.to_string(), start, &function.block);
        // A nested function is its own, and not a method.
        let owner = self.self_type.take();
        visit::visit_item_fn(self, function);
        self.self_type = owner;
    }

    fn visit_item_impl(&mut self, block: &'ast syn::ItemImpl) {
        if is_test_only(&block.attrs) {
            return;
        }
        let owner = match &*block.self_ty {
            syn::Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.self_type, owner);
        visit::visit_item_impl(self, block);
        self.self_type = outer;
    }

    fn visit_impl_item_fn(&mut self, method: &'ast syn::ImplItemFn) {
        if is_test_only(&method.attrs) {
            return;
        }
        let start = first_line(Some(&method.vis), &method.modifiers, &method.sig);
        self.record(self.method_name(&method.sig.ident), start, &method.block);
        let owner = self.self_type.take();
        visit::visit_impl_item_fn(self, method);
        self.self_type = owner;
    }

    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        if is_test_only(&item.attrs) {
            return;
        }
        let outer = self.self_type.replace(item.ident.to_string());
        visit::visit_item_trait(self, item);
        self.self_type = outer;
    }

    fn visit_trait_item_fn(&mut self, method: &'ast syn::TraitItemFn) {
        if is_test_only(&method.attrs) {
            return;
        }
        if let Some(block) = &method.default {
            let start = first_line(None, &method.modifiers, &method.sig);
            self.record(self.method_name(&method.sig.ident), start, block);
        }
        let owner = self.self_type.take();
        visit::visit_trait_item_fn(self, method);
        self.self_type = owner;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<(String, usize, String)> {
        functions(text, "f.rs")
            .unwrap()
            .into_iter()
            .map(|f| (f.name, f.lines, f.place))
            .collect()
    }

    #[test]
    fn a_struct_pattern_in_the_parameters_hides_nothing() {
        let text = "struct P { a: u8 }\n\
                    fn play(P { a }: P, (b, c): (u8, u8)) -> u8 {\n\
                    \x20   let s = \"}\";\n\
                    \x20   a + b + c\n\
                    }\n";
        assert_eq!(found(text), [("play".to_owned(), 4, "f.rs:2".to_owned())]);
    }

    #[test]
    fn methods_are_named_by_their_type_and_nested_functions_count_alone() {
        let text = "impl Job {\n\
                    \x20   pub async fn run(&self) {\n\
                    \x20       fn helper() {}\n\
                    \x20   }\n\
                    }\n\
                    trait T {\n\
                    \x20   fn declared(&self);\n\
                    \x20   fn given(&self) {\n\
                    \x20   }\n\
                    }\n";
        assert_eq!(
            found(text),
            [
                ("Job::run".to_owned(), 3, "f.rs:2".to_owned()),
                ("helper".to_owned(), 1, "f.rs:3".to_owned()),
                ("T::given".to_owned(), 2, "f.rs:8".to_owned()),
            ]
        );
    }

    #[test]
    fn tests_are_left_out() {
        let text = "fn product() {}\n\
                    #[cfg(test)]\nmod tests { fn helper() {} #[test] fn t() {} }\n\
                    #[cfg(all(test, feature = \"x\"))]\nfn only_in_tests() {}\n\
                    #[tokio::test]\nasync fn a_test() {}\n\
                    #[cfg(any(test, feature = \"x\"))]\nfn also_in_products() {}\n\
                    #[cfg(not(test))]\nfn only_in_products() {}\n";
        assert_eq!(
            found(text),
            [
                ("product".to_owned(), 1, "f.rs:1".to_owned()),
                ("also_in_products".to_owned(), 1, "f.rs:9".to_owned()),
                ("only_in_products".to_owned(), 1, "f.rs:11".to_owned()),
            ]
        );
    }

    #[test]
    fn a_function_starts_at_its_visibility_not_its_docs_or_attributes() {
        let text = "/// Docs.\n#[inline]\npub(crate)\nasync fn spread(\n) {\n}\n";
        assert_eq!(found(text), [("spread".to_owned(), 4, "f.rs:3".to_owned())]);
    }

    #[test]
    fn a_test_module_in_its_own_file_is_found_from_its_declaration() {
        let text = "#[cfg(test)]\nmod tests;\nmod other;\n";
        let files = test_module_files(Path::new("/w/src/store/read.rs"), text);
        assert_eq!(
            files,
            [
                PathBuf::from("/w/src/store/read/tests.rs"),
                PathBuf::from("/w/src/store/read/tests/mod.rs"),
            ]
        );
        let files = test_module_files(Path::new("/w/src/lib.rs"), text);
        assert_eq!(files[0], PathBuf::from("/w/src/tests.rs"));
        let text = "mod inner {\n    #[cfg(test)]\n    mod tests;\n}\n";
        let files = test_module_files(Path::new("/w/src/store/mod.rs"), text);
        assert_eq!(files[0], PathBuf::from("/w/src/store/inner/tests.rs"));
    }

    #[test]
    fn a_file_that_does_not_parse_is_an_error() {
        let err = functions("fn broken( {", "bad.rs").unwrap_err();
        assert!(format!("{err:#}").contains("bad.rs does not parse"));
    }

    #[test]
    fn the_limit_and_the_count_are_read_from_the_arguments() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect();
        assert!(matches!(mode(args(&[])), Ok(Mode::Longest(15))));
        assert!(matches!(mode(args(&["40"])), Ok(Mode::Longest(40))));
        assert!(matches!(mode(args(&["--max", "80"])), Ok(Mode::Over(80))));
        assert!(mode(args(&["--max"])).is_err());
        assert!(mode(args(&["--max", "eighty"])).is_err());
    }
}
