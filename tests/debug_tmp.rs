mod common;
use kafkapipe::conn::*;
use kafkapipe::record::*;
#[tokio::test]
async fn dbg() {
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    conn.create_topic("dbg", 1, 1).await.unwrap();
    for n in [3usize, 4, 5] {
        let recs: Vec<Record> = (0..n).map(|i| Record::new(format!("k{i}"), format!("v{i}"))).collect();
        let b = conn.produce("dbg", 0, &recs, &ProduceOptions::default()).await.unwrap();
        eprintln!("produced {n} at {b}; last={}", conn.last_offset("dbg",0).await.unwrap());
    }
    let f = conn.fetch("dbg", 0, 0, &FetchOptions::default()).await.unwrap();
    eprintln!("next {} hw {} recs {:?}", f.next_offset, f.high_watermark, f.records.iter().map(|r| (r.offset, r.key.clone())).collect::<Vec<_>>());
}
