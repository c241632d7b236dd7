//! `kafkapipe`: a small kcat-style command line tool over the kafkapipe crate.
//!
//! ```sh
//! cargo run --example kafkapipe -- -b 127.0.0.1:9092 topics create events -p 3
//! printf 'user-1:hello\nuser-2:world\n' | cargo run --example kafkapipe -- produce events -k :
//! cargo run --example kafkapipe -- consume events -o beginning -e -k :
//! cargo run --example kafkapipe -- offsets events
//! cargo run --example kafkapipe -- groups
//! ```
//!
//! Run `kafkapipe --help` for every command. Data goes to stdout; progress and summary
//! lines (prefixed `%`) go to stderr.

#[path = "kafkapipe/cli.rs"]
mod cli;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    let r = cli::run(&args, &mut input, &mut out, &mut err).await;
    let _ = std::io::Write::flush(&mut out);
    match r {
        Err(e) if e == cli::BROKEN_PIPE => {}
        Err(e) => {
            eprintln!("kafkapipe: {e}");
            std::process::exit(1);
        }
        Ok(()) => {}
    }
}
