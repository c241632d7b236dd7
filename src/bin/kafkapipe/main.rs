//! `kafkapipe`: a kcat-style command line tool over the kafkapipe crate.
//!
//! ```sh
//! cargo install kafkapipe --features cli     # or: cargo install --path . --features cli
//! kafkapipe -b 127.0.0.1:9092 topics create events -p 3
//! printf 'user-1:hello\nuser-2:world\n' | kafkapipe produce events -k :
//! kafkapipe consume events -o beginning -e -f '%p %o %k %s\n'
//! kafkapipe consume events -g my-group -J
//! kafkapipe acls create --resource-type topic --resource events --principal User:alice --operation write
//! echo secret | kafkapipe users scram upsert alice --password-stdin
//! ```
//!
//! Run `kafkapipe --help` and `kafkapipe COMMAND --help` for every option. Records go to
//! stdout; progress and summary lines (prefixed `%`) go to stderr.

mod admin;
mod consume;
mod format;
mod produce;
mod security;
mod settings;
mod shutdown;

use clap::{Args, CommandFactory, Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit codes:
  0  success; also after SIGINT/SIGTERM when the command stopped cleanly (consume: what
     was printed is committed, the group is left; produce: every record read from stdin
     was acknowledged) and when stdout is closed (| head)
  1  the command failed (broker, network, authentication, I/O), or produce stopped with
     records not delivered (their count is on stderr)
  2  usage error (bad arguments, unknown -X setting or bad value)

Client settings (-X KEY=VALUE, repeatable; `-X list` shows every key):
  -X security.protocol=sasl_ssl -X sasl.mechanism=SCRAM-SHA-512
  -X sasl.username=alice -X sasl.password=secret
  TLS trusts the system roots (SSL_CERT_FILE / SSL_CERT_DIR when set) unless
  -X ssl.ca.location=ca.pem or a truststore is given.";

/// A kcat-style Apache Kafka command line tool: produce, consume (alone or in a consumer
/// group), and manage topics, groups, ACLs and SCRAM users.
#[derive(Debug, Parser)]
#[command(name = "kafkapipe", version, after_help = EXIT_CODES)]
struct Cli {
    /// Bootstrap brokers, host:port (comma-separated or repeated; default: -X
    /// bootstrap.servers, else 127.0.0.1:9092).
    #[arg(
        short = 'b',
        long = "brokers",
        global = true,
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    brokers: Vec<String>,
    /// A client setting by its Kafka name, e.g. -X security.protocol=sasl_ssl (repeatable;
    /// `-X list` shows every key).
    #[arg(short = 'X', global = true, value_name = "KEY=VALUE")]
    settings: Vec<String>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List, create, delete or describe topics (default: list).
    Topics {
        #[command(subcommand)]
        cmd: Option<TopicsCmd>,
    },
    /// Write stdin to a topic, one record per line.
    Produce(ProduceArgs),
    /// Print a topic's records to stdout, one per line (or per -f format / JSON line).
    Consume(ConsumeArgs),
    /// List, describe or delete consumer groups (default: list).
    Groups {
        #[command(subcommand)]
        cmd: Option<GroupsCmd>,
    },
    /// Print partition, earliest and latest offset of each partition of a topic.
    Offsets {
        /// The topic.
        topic: String,
    },
    /// Print the cluster id, the controller and the brokers.
    Cluster,
    /// List, create or delete ACLs (the broker needs an authorizer).
    Acls {
        #[command(subcommand)]
        cmd: security::AclsCmd,
    },
    /// Manage users' SCRAM credentials.
    Users {
        #[command(subcommand)]
        cmd: security::UsersCmd,
    },
    /// Describe or alter client quotas (KIP-546).
    Quotas {
        #[command(subcommand)]
        cmd: QuotasCmd,
    },
}

/// The entity a `quotas` command is about: at most one user and one client id, or an ip.
#[derive(Debug, Args)]
pub struct QuotaEntityArgs {
    /// A user (principal name).
    #[arg(long, conflicts_with = "default_user")]
    pub user: Option<String>,
    /// The default user (every user without a quota of its own).
    #[arg(long)]
    pub default_user: bool,
    /// A client id.
    #[arg(long, conflicts_with = "default_client_id")]
    pub client_id: Option<String>,
    /// The default client id.
    #[arg(long)]
    pub default_client_id: bool,
    /// An IP address (only `connection_creation_rate`).
    #[arg(long, conflicts_with = "default_ip")]
    pub ip: Option<String>,
    /// The default IP.
    #[arg(long)]
    pub default_ip: bool,
}

#[derive(Debug, Subcommand)]
pub enum QuotasCmd {
    /// Print the quotas of the entities matching the given components (all without any):
    /// one line per entity, `ENTITY<TAB>key=value,...`.
    Describe {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        /// Only entities made of exactly the given component types.
        #[arg(long)]
        strict: bool,
    },
    /// Set or remove quota values of one entity, e.g.
    /// `quotas alter --client-id app --set producer_byte_rate=1048576`.
    Alter {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        /// Set a quota (repeatable): producer_byte_rate, consumer_byte_rate,
        /// request_percentage, controller_mutation_rate, connection_creation_rate.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Remove a quota (repeatable).
        #[arg(long = "remove", value_name = "KEY")]
        remove: Vec<String>,
        /// Only have the broker validate the change.
        #[arg(long)]
        validate_only: bool,
    },
}

#[derive(Debug, Subcommand)]
enum TopicsCmd {
    /// List topics: name and partition count.
    List,
    /// Create a topic.
    Create {
        /// The topic name.
        name: String,
        /// Number of partitions.
        #[arg(short = 'p', long, default_value_t = 1)]
        partitions: i32,
        /// Replication factor (-1: the broker's default).
        #[arg(short = 'r', long, default_value_t = -1, allow_negative_numbers = true)]
        replication: i16,
        /// A topic config, e.g. -c retention.ms=86400000 (repeatable).
        #[arg(short = 'c', long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// Delete topics.
    Delete {
        /// The topics.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Partitions, leaders, replicas, ISR and configs of topics.
    Describe {
        /// The topics.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum GroupsCmd {
    /// List groups: id, state, protocol type, group type (classic, consumer, share).
    List,
    /// Members, assignments, committed offsets and lag of a group.
    Describe {
        /// The group.
        group: String,
        /// Read only stable committed offsets (OffsetFetch `require_stable`): every
        /// commit the coordinator acknowledged, also right after a coordinator failover.
        #[arg(long)]
        require_stable: bool,
    },
    /// Delete groups (they must have no members).
    Delete {
        /// The groups.
        #[arg(required = true)]
        groups: Vec<String>,
    },
}

/// `produce` options.
#[derive(Debug, Args)]
#[command(
    after_help = "Each stdin line is one record (a trailing \\r is dropped). Records are \
    batched; the command exits once every record is acknowledged (exit 0) or failed (exit \
    1, the count of records not delivered on stderr).\n\
    SIGINT/SIGTERM: stop reading stdin, wait up to 3 s for what was read to be \
    acknowledged: exit 0 if all of it was, else exit 1 saying how many records were not \
    delivered. A second signal exits at once."
)]
pub struct ProduceArgs {
    /// The topic.
    pub topic: String,
    /// Split each line at the first SEP into key and value (a line without SEP is a
    /// value with a null key).
    #[arg(short = 'k', long = "key-delimiter", value_name = "SEP")]
    pub key_delimiter: Option<String>,
    /// Write every record to this partition (default: where --partitioner says).
    #[arg(short = 'p', long)]
    pub partition: Option<i32>,
    /// Where records go without -p (librdkafka's `partitioner` names): sticky (default) or
    /// murmur2_random: keys by murmur2 like the Java client, keyless records to one
    /// partition at a time; murmur2: the same, keyless records all to one partition;
    /// consistent_random (librdkafka's and kcat's default): keys by CRC32, keyless or
    /// empty-key records spread; consistent: the same, those all to one partition;
    /// random: every record to a random partition; round_robin: every record to the next
    /// partition (kafka-go's default; keys ignored).
    #[arg(long, value_name = "NAME", default_value = "sticky",
          value_parser = produce::parse_partitioner)]
    pub partitioner: produce::Partitioner,
    /// Add a header to every record (repeatable).
    #[arg(short = 'H', long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Compression codec: none, gzip, snappy, lz4, zstd.
    #[arg(short = 'z', long, value_name = "CODEC", value_parser = settings::parse_compression)]
    pub compression: Option<kafkapipe::compression::Compression>,
    /// Acknowledgements to wait for: all (= -1), 1 (the leader) or 0 (none).
    #[arg(short = 'a', long, value_name = "ACKS", allow_hyphen_values = true,
          value_parser = settings::parse_acks)]
    pub acks: Option<kafkapipe::conn::RequiredAcks>,
    /// Print a summary line on stderr every SECS seconds (count, rate, and lag/errors
    /// or delivery counts); 0 prints none.
    #[arg(long, value_name = "SECS", default_value = "2")]
    pub stats: StatsInterval,
}

/// `consume` options.
#[derive(Debug, Args)]
#[command(
    after_help = "Format (-f): %t topic, %p partition, %o offset, %T timestamp (ms), \
    %k key, %K key length, %s value, %S value length, %h headers (k=v,k=v), %% a percent \
    sign; escapes \\n \\r \\t \\\\. Null keys and values print nothing, their length -1.\n\
    JSON (-J): {\"topic\",\"partition\",\"offset\",\"timestamp\",\"key\",\"value\",\
    \"headers\":[[k,v],...]} per line; null keys/values are null, bytes are read as UTF-8.\n\
    With -g, a record is committed only after it was written to stdout and flushed; \
    SIGINT/SIGTERM stop fetching, flush, commit what was printed, leave the group and exit \
    0. With --share-group, a record is accepted only after it was written and flushed; \
    SIGINT/SIGTERM stop fetching, flush, accept what was printed, release the rest, leave \
    the group and exit 0. Without -e, output is flushed whenever no further record is ready."
)]
pub struct ConsumeArgs {
    /// The topic.
    pub topic: String,
    /// Read only these partitions (comma-separated; not with -g).
    #[arg(short = 'p', long, value_delimiter = ',', conflicts_with = "group")]
    pub partitions: Vec<i32>,
    /// Start offset: beginning, end, N, -N (N before the end) or @MS (the first record
    /// at/after a time). With -g only beginning or end, used where the group has no
    /// committed offset.
    #[arg(short = 'o', long, default_value = "end", allow_hyphen_values = true)]
    pub offset: String,
    /// Exit after COUNT records.
    #[arg(short = 'c', long)]
    pub count: Option<u64>,
    /// Exit at the end of every partition (not with -g).
    #[arg(short = 'e', long = "exit", conflicts_with = "group")]
    pub exit_at_end: bool,
    /// Consume as a member of consumer group GROUP, committing what was printed.
    #[arg(short = 'g', long, conflicts_with = "share_group")]
    pub group: Option<String>,
    /// Consume as a member of share group GROUP (KIP-932, Kafka 4.2+): every record is
    /// accepted once printed and flushed; on SIGINT/SIGTERM what was not printed is
    /// released to the other members.
    #[arg(long = "share-group", value_name = "GROUP",
          conflicts_with_all = ["partitions", "exit_at_end"])]
    pub share_group: Option<String>,
    /// The group protocol with -g: classic (JoinGroup/SyncGroup) or consumer (KIP-848,
    /// Kafka 4.0+).
    #[arg(long = "group-protocol", value_name = "PROTOCOL", default_value = "classic",
          value_parser = ["classic", "consumer"], requires = "group")]
    pub group_protocol: String,
    /// Print KEY<SEP>VALUE instead of the value.
    #[arg(short = 'k', long = "key-delimiter", value_name = "SEP",
          conflicts_with_all = ["format", "json"])]
    pub key_delimiter: Option<String>,
    /// Print each record by this format (see below).
    #[arg(short = 'f', long, conflicts_with = "json")]
    pub format: Option<String>,
    /// Print each record as one JSON object per line.
    #[arg(short = 'J', long)]
    pub json: bool,
    /// Print a summary line on stderr every SECS seconds (count, rate, and lag/errors
    /// or delivery counts); 0 prints none.
    #[arg(long, value_name = "SECS", default_value = "2")]
    pub stats: StatsInterval,
}

/// How a command ends when it does not succeed.
#[derive(Debug)]
pub enum Fail {
    /// Bad arguments or settings: exit 2.
    Usage(String),
    /// The command failed: exit 1.
    Run(String),
    /// Stdout was closed by the reader (`| head`): a normal end, exit 0.
    Pipe,
}

impl From<kafkapipe::Error> for Fail {
    fn from(e: kafkapipe::Error) -> Self {
        Fail::Run(e.to_string())
    }
}

impl From<String> for Fail {
    fn from(e: String) -> Self {
        Fail::Run(e)
    }
}

/// A write to stdout failed: a closed pipe ends quietly, anything else is an error.
pub fn io(e: std::io::Error) -> Fail {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Fail::Pipe
    } else {
        Fail::Run(format!("writing stdout: {e}"))
    }
}

fn usage_exit(msg: String) -> ! {
    let mut cmd = Cli::command();
    cmd.error(clap::error::ErrorKind::InvalidValue, msg).exit()
}

fn main() {
    let cli = Cli::parse();
    if cli.settings.iter().any(|s| s == "list") {
        println!("-X settings (Kafka client names):");
        for (k, what) in settings::KEYS {
            println!("  {k:<38} {what}");
        }
        println!("Accepted and ignored:");
        for (k, why) in settings::IGNORED_KEYS {
            println!("  {k:<38} {why}");
        }
        return;
    }
    let Some(cmd) = cli.cmd else {
        let _ = Cli::command().print_help();
        std::process::exit(2);
    };
    let settings = match settings::Settings::parse(&cli.settings) {
        Ok(s) => s,
        Err(e) => usage_exit(e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kafkapipe: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let brokers = settings.brokers(&cli.brokers);
    let r = runtime.block_on(run(cmd, &brokers, &settings));
    // Background tasks (connections) must not hold the exit up.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match r {
        Ok(()) | Err(Fail::Pipe) => {}
        Err(Fail::Usage(e)) => usage_exit(e),
        Err(Fail::Run(e)) => {
            eprintln!("kafkapipe: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(cmd: Cmd, brokers: &[String], settings: &settings::Settings) -> Result<(), Fail> {
    match cmd {
        Cmd::Produce(args) => produce::run(brokers, settings, &args).await,
        Cmd::Consume(args) => consume::run(brokers, settings, &args).await,
        cmd => {
            let admin = kafkapipe::admin::Admin::new(settings.cluster(brokers)?);
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let r = match cmd {
                Cmd::Topics { cmd } => admin::topics(&admin, cmd, &mut out).await,
                Cmd::Groups { cmd } => admin::groups(&admin, cmd, &mut out).await,
                Cmd::Offsets { topic } => admin::offsets(&admin, &topic, &mut out).await,
                Cmd::Cluster => admin::cluster(&admin, &mut out).await,
                Cmd::Acls { cmd } => security::acls(&admin, cmd, &mut out).await,
                Cmd::Users { cmd } => security::users(&admin, cmd, &mut out).await,
                Cmd::Quotas { cmd } => admin::quotas(&admin, cmd, &mut out).await,
                Cmd::Produce(_) | Cmd::Consume(_) => Ok(()),
            };
            let flushed = std::io::Write::flush(&mut out).map_err(io);
            admin.close().await;
            r.and(flushed)
        }
    }
}

/// `--stats SECS`: how often `consume`/`produce` print their summary line.
#[derive(Debug, Clone, Copy)]
pub struct StatsInterval(Option<std::time::Duration>);

impl StatsInterval {
    /// Between lines; `None` for none.
    pub fn every(self) -> Option<std::time::Duration> {
        self.0
    }
}

impl std::str::FromStr for StatsInterval {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let secs: f64 = s
            .parse()
            .map_err(|_| format!("{s:?} is not a number of seconds"))?;
        if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
            return Err(format!("{s:?}: seconds between 0 and 86400"));
        }
        Ok(StatsInterval(
            (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs)),
        ))
    }
}
