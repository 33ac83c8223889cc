#!/usr/bin/env node
// kafkajs 2.x compatibility smoke test for Spate.
//
//   node tests/js/smoke.js HOST:PORT
//
// Admin: createTopics (3 partitions), fetchTopicMetadata, describeConfigs; producer
// (idempotent: false, allowAutoTopicCreation: false): keyed messages with headers, plain
// and gzip batches; a consumer group of two consumers reads everything back and every
// key / value / header / timestamp and the per-partition order are checked; both members
// commit; admin fetchOffsets, fetchTopicOffsets, listGroups, describeGroups, deleteGroups,
// deleteTopics.  Exits 0 when everything matches; otherwise prints what did not and exits
// 1 (2 on the overall timeout).  KAFKAJS_LOG=debug|info|warn|error sets kafkajs' logging.
'use strict'

const {
  Kafka,
  logLevel,
  CompressionTypes,
  ConfigResourceTypes,
  Partitioners,
  AssignerProtocol,
} = require('kafkajs')

const bootstrap = process.argv[2]
if (!bootstrap) {
  console.error('usage: node smoke.js HOST:PORT')
  process.exit(64)
}

const OVERALL_TIMEOUT_MS = Number(process.env.SMOKE_TIMEOUT_MS || 120000)
const STEP_TIMEOUT_MS = 30000
const PARTITIONS = 3
const PER_BATCH = 60 // messages per produce call
const KEYS = 12
const suffix = `${Date.now().toString(36)}-${process.pid}`
const TOPIC = `kafkajs-smoke-${suffix}`
const GROUP = `kafkajs-smoke-group-${suffix}`

const t0 = Date.now()
const log = (...args) => console.log(`[${((Date.now() - t0) / 1000).toFixed(2)}s]`, ...args)

class Mismatch extends Error {}
function check(cond, msg) {
  if (!cond) throw new Mismatch(msg)
}
const fmt = v => JSON.stringify(v, (k, x) => (typeof x === 'bigint' ? String(x) : x))

async function withTimeout(what, promise, ms = STEP_TIMEOUT_MS) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms}ms: ${what}`)), ms)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

async function waitFor(what, pred, ms = STEP_TIMEOUT_MS, interval = 50) {
  const deadline = Date.now() + ms
  for (;;) {
    if (await pred()) return
    if (Date.now() > deadline) throw new Error(`timed out after ${ms}ms waiting for ${what}`)
    await new Promise(r => setTimeout(r, interval))
  }
}

const levels = { debug: logLevel.DEBUG, info: logLevel.INFO, warn: logLevel.WARN, error: logLevel.ERROR, nothing: logLevel.NOTHING }
const kafka = new Kafka({
  clientId: 'spate-kafkajs-smoke',
  brokers: [bootstrap],
  connectionTimeout: 5000,
  requestTimeout: 15000,
  logLevel: levels[(process.env.KAFKAJS_LOG || 'warn').toLowerCase()] ?? logLevel.WARN,
  retry: { initialRetryTime: 100, retries: 5 },
})

// ---- the messages ----------------------------------------------------------------------
// Two produce calls (no compression, then gzip), each with PER_BATCH keyed messages. The
// expected partition of each message is computed with the same partitioner the producer
// uses (murmur2 of the key), so partition placement, offsets and order can be checked.
const partitioner = Partitioners.DefaultPartitioner()
const partitionMetadata = Array.from({ length: PARTITIONS }, (_, i) => ({
  partitionId: i,
  leader: 0,
  replicas: [0],
  isr: [0],
}))

const BASE_TS = Date.now() - 60000
function makeMessage(seq, batch) {
  const key = `key-${seq % KEYS}`
  const headers = {
    'x-seq': String(seq),
    'x-batch': batch,
    // binary header value, every byte value
    'x-bin': Buffer.from(Array.from({ length: 256 }, (_, i) => (i + seq) & 0xff)),
    // repeated header key: kafkajs writes two headers, reads them back as an array
    'x-multi': [`a-${seq}`, `b-${seq}`],
    'x-empty': '',
  }
  // one tombstone (null value) per batch; one large-ish value per batch
  let value
  if (seq % PER_BATCH === 7) value = null
  else if (seq % PER_BATCH === 13) value = Buffer.alloc(20000, `big-${seq}|`)
  else value = Buffer.from(JSON.stringify({ seq, batch, text: `héllo ✓ ${seq}` }))
  return { key, value, headers, timestamp: String(BASE_TS + seq) }
}

function expectedPartition(message) {
  return partitioner({ topic: TOPIC, partitionMetadata, message: { ...message, key: Buffer.from(message.key) } })
}

function headerToComparable(v) {
  if (Array.isArray(v)) return v.map(headerToComparable)
  if (v === null || v === undefined) return v
  return Buffer.isBuffer(v) ? v.toString('hex') : Buffer.from(String(v)).toString('hex')
}

function compareMessage(where, exp, got) {
  check(got.key !== null && got.key.toString() === exp.key, `${where}: key ${fmt(got.key && got.key.toString())} != ${fmt(exp.key)}`)
  if (exp.value === null) {
    check(got.value === null, `${where}: expected a null value (tombstone), got ${got.value && got.value.length} bytes`)
  } else {
    check(got.value !== null, `${where}: expected a ${exp.value.length}-byte value, got null`)
    check(Buffer.compare(got.value, exp.value) === 0,
      `${where}: value differs: got ${fmt(got.value.toString().slice(0, 80))} (${got.value.length} bytes),` +
      ` expected ${fmt(exp.value.toString().slice(0, 80))} (${exp.value.length} bytes)`)
  }
  check(got.timestamp === exp.timestamp, `${where}: timestamp ${got.timestamp} != ${exp.timestamp}`)
  const gotH = {}
  for (const [k, v] of Object.entries(got.headers || {})) gotH[k] = headerToComparable(v)
  const expH = {}
  for (const [k, v] of Object.entries(exp.headers)) expH[k] = headerToComparable(v)
  check(fmt(Object.keys(gotH).sort()) === fmt(Object.keys(expH).sort()),
    `${where}: header keys ${fmt(Object.keys(gotH))} != ${fmt(Object.keys(expH))}`)
  for (const k of Object.keys(expH)) {
    check(fmt(gotH[k]) === fmt(expH[k]), `${where}: header ${k}: got ${fmt(gotH[k])} expected ${fmt(expH[k])}`)
  }
}

// ---- the test ----------------------------------------------------------------------------
const admin = kafka.admin()
const producer = kafka.producer({
  idempotent: false,
  allowAutoTopicCreation: false,
  createPartitioner: Partitioners.DefaultPartitioner,
})
const consumers = []

async function main() {
  log(`bootstrap ${bootstrap}, topic ${TOPIC}, group ${GROUP}`)
  await withTimeout('admin.connect', admin.connect())

  // -- createTopics + metadata + configs
  const created = await withTimeout('createTopics', admin.createTopics({
    topics: [{ topic: TOPIC, numPartitions: PARTITIONS, replicationFactor: 1 }],
    waitForLeaders: true,
  }))
  check(created === true, `createTopics returned ${created}, expected true (topic newly created)`)
  const again = await withTimeout('createTopics (existing)', admin.createTopics({
    topics: [{ topic: TOPIC, numPartitions: PARTITIONS, replicationFactor: 1 }],
    waitForLeaders: false,
  }))
  check(again === false, `createTopics of an existing topic returned ${again}, expected false`)
  log('createTopics ok')

  const topics = await withTimeout('listTopics', admin.listTopics())
  check(topics.includes(TOPIC), `listTopics ${fmt(topics)} lacks ${TOPIC}`)

  const md = await withTimeout('fetchTopicMetadata', admin.fetchTopicMetadata({ topics: [TOPIC] }))
  check(md.topics.length === 1 && md.topics[0].name === TOPIC, `fetchTopicMetadata: ${fmt(md)}`)
  const mdParts = md.topics[0].partitions.map(p => p.partitionId).sort((a, b) => a - b)
  check(fmt(mdParts) === fmt([0, 1, 2]), `metadata partitions ${fmt(mdParts)}, expected [0,1,2]`)
  for (const p of md.topics[0].partitions) {
    check(p.partitionErrorCode === 0, `partition ${p.partitionId} error code ${p.partitionErrorCode}`)
    check(p.leader >= 0, `partition ${p.partitionId} has no leader: ${fmt(p)}`)
  }
  log('fetchTopicMetadata ok')

  const cfg = await withTimeout('describeConfigs', admin.describeConfigs({
    resources: [{ type: ConfigResourceTypes.TOPIC, name: TOPIC }],
    includeSynonyms: false,
  }))
  check(cfg.resources.length === 1, `describeConfigs returned ${cfg.resources.length} resources`)
  const res = cfg.resources[0]
  check(res.errorCode === 0, `describeConfigs error ${res.errorCode} ${res.errorMessage}`)
  check(res.resourceName === TOPIC, `describeConfigs resource name ${res.resourceName}`)
  const retention = res.configEntries.find(e => e.configName === 'retention.ms')
  check(retention, `describeConfigs: no retention.ms among ${fmt(res.configEntries.map(e => e.configName))}`)
  check(/^-?\d+$/.test(retention.configValue), `retention.ms value ${fmt(retention.configValue)} is not a number`)
  const cfgNamed = await withTimeout('describeConfigs (named)', admin.describeConfigs({
    resources: [{ type: ConfigResourceTypes.TOPIC, name: TOPIC, configNames: ['retention.ms'] }],
    includeSynonyms: false,
  }))
  const namedEntries = cfgNamed.resources[0].configEntries.map(e => e.configName)
  check(fmt(namedEntries) === fmt(['retention.ms']), `describeConfigs(configNames=[retention.ms]) returned ${fmt(namedEntries)}`)
  log(`describeConfigs ok (retention.ms=${retention.configValue}, ${res.configEntries.length} entries)`)

  // -- consumers: two members of one group, subscribed before anything is produced
  const assignments = new Map() // consumer index -> [partitions]
  const received = new Map() // "p:offset" -> {consumer, message}
  const byConsumer = [[], []]
  let duplicates = 0
  let crashed = null
  for (let i = 0; i < 2; i++) {
    const consumer = kafka.consumer({
      groupId: GROUP,
      sessionTimeout: 10000,
      rebalanceTimeout: 15000,
      heartbeatInterval: 500,
      maxWaitTimeInMs: 250,
      allowAutoTopicCreation: false,
      retry: { retries: 3 },
    })
    consumers.push(consumer)
    consumer.on(consumer.events.GROUP_JOIN, e => {
      const parts = (e.payload.memberAssignment[TOPIC] || []).slice().sort((a, b) => a - b)
      assignments.set(i, { parts, leader: e.payload.isLeader, memberId: e.payload.memberId })
      log(`consumer ${i} joined (${e.payload.memberId}, leader=${e.payload.isLeader}), partitions ${fmt(parts)}`)
    })
    consumer.on(consumer.events.CRASH, e => {
      crashed = crashed || new Error(`consumer ${i} crashed: ${e.payload.error && (e.payload.error.stack || e.payload.error)}`)
    })
    await withTimeout(`consumer ${i} connect`, consumer.connect())
    await withTimeout(`consumer ${i} subscribe`, consumer.subscribe({ topics: [TOPIC], fromBeginning: true }))
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ topic, partition, message }) => {
        check(topic === TOPIC, `consumer ${i} got a message of topic ${topic}`)
        const id = `${partition}:${message.offset}`
        const prev = received.get(id)
        if (prev) {
          // a redelivery after a rebalance is legal; different content at one offset is not
          duplicates++
          check(Buffer.compare(prev.message.value || Buffer.alloc(0), message.value || Buffer.alloc(0)) === 0,
            `offset ${id} delivered twice with different values`)
          return
        }
        received.set(id, { consumer: i, message })
        byConsumer[i].push({ partition, offset: message.offset })
      },
    })
  }
  await waitFor('both consumers to be assigned partitions', () => {
    if (crashed) throw crashed
    if (assignments.size < 2) return false
    const all = [...assignments.values()].flatMap(a => a.parts).sort((a, b) => a - b)
    return fmt(all) === fmt([0, 1, 2]) && [...assignments.values()].every(a => a.parts.length > 0)
  })
  log(`group stable: ${fmt([...assignments.entries()].map(([i, a]) => [i, a.parts]))}`)

  // describeGroups while both members are in
  const dg = await withTimeout('describeGroups (stable)', admin.describeGroups([GROUP]))
  check(dg.groups.length === 1, `describeGroups returned ${dg.groups.length} groups`)
  const g = dg.groups[0]
  check(g.errorCode === 0, `describeGroups error code ${g.errorCode}`)
  check(g.groupId === GROUP, `describeGroups groupId ${g.groupId}`)
  check(g.state === 'Stable', `describeGroups state ${g.state}, expected Stable`)
  check(g.protocolType === 'consumer', `describeGroups protocolType ${g.protocolType}`)
  check(g.protocol === 'RoundRobinAssigner', `describeGroups protocol ${g.protocol}, expected RoundRobinAssigner`)
  check(g.members.length === 2, `describeGroups has ${g.members.length} members, expected 2`)
  const describedParts = []
  for (const m of g.members) {
    check(m.clientId === 'spate-kafkajs-smoke', `member ${m.memberId} clientId ${m.clientId}`)
    const meta = AssignerProtocol.MemberMetadata.decode(m.memberMetadata)
    check(meta && fmt(meta.topics) === fmt([TOPIC]), `member ${m.memberId} metadata topics ${fmt(meta && meta.topics)}`)
    const asg = AssignerProtocol.MemberAssignment.decode(m.memberAssignment)
    check(asg, `member ${m.memberId}: empty/undecodable memberAssignment`)
    describedParts.push(...(asg.assignment[TOPIC] || []))
  }
  describedParts.sort((a, b) => a - b)
  check(fmt(describedParts) === fmt([0, 1, 2]), `describeGroups assignments cover ${fmt(describedParts)}, expected [0,1,2]`)
  log('describeGroups (Stable, 2 members) ok')

  // -- produce
  await withTimeout('producer.connect', producer.connect())
  const expected = [[], [], []] // per partition, in produce order
  let seq = 0
  for (const [batch, compression] of [['plain', CompressionTypes.None], ['gzip', CompressionTypes.GZIP]]) {
    const messages = []
    for (let j = 0; j < PER_BATCH; j++) messages.push(makeMessage(seq++, batch))
    const sendRes = await withTimeout(`producer.send (${batch})`, producer.send({ topic: TOPIC, acks: -1, compression, messages }))
    for (const r of sendRes) {
      check(r.topicName === TOPIC && r.errorCode === 0, `produce result ${fmt(r)}`)
      const base = Number(r.baseOffset)
      check(base === expected[r.partition].length,
        `${batch} batch on partition ${r.partition}: baseOffset ${r.baseOffset}, expected ${expected[r.partition].length}`)
    }
    for (const m of messages) expected[expectedPartition(m)].push(m)
    const touched = new Set(messages.map(expectedPartition))
    check(sendRes.length === touched.size,
      `${batch}: ${sendRes.length} produce results for ${touched.size} partitions: ${fmt(sendRes)}`)
  }
  // one more: a single keyed gzip message through sendBatch with acks=1
  const lastMsg = makeMessage(seq++, 'sendBatch')
  const sb = await withTimeout('producer.sendBatch', producer.sendBatch({
    acks: 1,
    compression: CompressionTypes.GZIP,
    topicMessages: [{ topic: TOPIC, messages: [lastMsg] }],
  }))
  check(sb.length === 1 && sb[0].errorCode === 0, `sendBatch result ${fmt(sb)}`)
  const lp = expectedPartition(lastMsg)
  check(sb[0].partition === lp && Number(sb[0].baseOffset) === expected[lp].length,
    `sendBatch: partition ${sb[0].partition} baseOffset ${sb[0].baseOffset}, expected partition ${lp} offset ${expected[lp].length}`)
  expected[lp].push(lastMsg)
  const total = expected.reduce((n, e) => n + e.length, 0)
  log(`produced ${total} messages, per partition ${fmt(expected.map(e => e.length))}`)
  check(expected.every(e => e.length > 0), `the keys did not spread over all partitions: ${fmt(expected.map(e => e.length))}`)

  // high watermarks
  const tOffsets = await withTimeout('fetchTopicOffsets', admin.fetchTopicOffsets(TOPIC))
  for (const p of tOffsets) {
    check(Number(p.low) === 0 && Number(p.high) === expected[p.partition].length && Number(p.offset) === Number(p.high),
      `fetchTopicOffsets partition ${p.partition}: ${fmt(p)}, expected low 0 high ${expected[p.partition].length}`)
  }

  // -- consume everything back
  await waitFor(`all ${total} messages to be consumed`, () => {
    if (crashed) throw crashed
    return received.size >= total
  }, STEP_TIMEOUT_MS)
  check(received.size === total, `received ${received.size} distinct offsets, expected ${total}`)
  for (let p = 0; p < PARTITIONS; p++) {
    for (let off = 0; off < expected[p].length; off++) {
      const r = received.get(`${p}:${off}`)
      check(r, `partition ${p} offset ${off} was never delivered`)
      compareMessage(`partition ${p} offset ${off}`, expected[p][off], r.message)
    }
  }
  // per-partition delivery order as seen by each consumer
  for (let i = 0; i < 2; i++) {
    const last = {}
    for (const { partition, offset } of byConsumer[i]) {
      const o = Number(offset)
      check(last[partition] === undefined || o === last[partition] + 1,
        `consumer ${i}: partition ${partition} offset ${o} delivered after ${last[partition]}`)
      last[partition] = o
    }
  }
  for (let i = 0; i < 2; i++) {
    const mine = new Set(byConsumer[i].map(x => x.partition))
    for (const p of mine) {
      check(assignments.get(i).parts.includes(p),
        `consumer ${i} got partition ${p}, not in its assignment ${fmt(assignments.get(i).parts)}`)
    }
    check(byConsumer[i].length > 0, `consumer ${i} received nothing`)
  }
  log(`consumed ${received.size} messages (${byConsumer[0].length} + ${byConsumer[1].length}, ${duplicates} redelivered), contents and order ok`)

  // -- commit: each member commits its own partitions (the next offset to read)
  for (let i = 0; i < 2; i++) {
    const offs = assignments.get(i).parts.map(p => ({ topic: TOPIC, partition: p, offset: String(expected[p].length) }))
    await withTimeout(`consumer ${i} commitOffsets`, consumers[i].commitOffsets(offs))
  }
  log('commitOffsets ok')

  const fo = await withTimeout('fetchOffsets', admin.fetchOffsets({ groupId: GROUP, topics: [TOPIC] }))
  check(fo.length === 1 && fo[0].topic === TOPIC, `fetchOffsets: ${fmt(fo)}`)
  const committed = fo[0].partitions.slice().sort((a, b) => a.partition - b.partition)
  check(committed.length === PARTITIONS, `fetchOffsets returned ${committed.length} partitions: ${fmt(committed)}`)
  for (const c of committed) {
    check(Number(c.offset) === expected[c.partition].length,
      `fetchOffsets partition ${c.partition}: committed ${c.offset}, expected ${expected[c.partition].length}`)
  }
  log(`fetchOffsets ok: ${fmt(committed.map(c => [c.partition, c.offset]))}`)

  const lg = await withTimeout('listGroups', admin.listGroups())
  const mine = lg.groups.find(x => x.groupId === GROUP)
  check(mine, `listGroups ${fmt(lg.groups)} lacks ${GROUP}`)
  check(mine.protocolType === 'consumer', `listGroups protocolType ${mine.protocolType}`)
  log('listGroups ok')

  // -- leave; the group becomes Empty and keeps its offsets
  for (const c of consumers) await withTimeout('consumer.disconnect', c.disconnect())
  consumers.length = 0
  const dg2 = await withTimeout('describeGroups (empty)', admin.describeGroups([GROUP]))
  check(dg2.groups[0].state === 'Empty' && dg2.groups[0].members.length === 0,
    `after both consumers left: state ${dg2.groups[0].state}, ${dg2.groups[0].members.length} members (expected Empty, 0)`)
  const fo2 = await withTimeout('fetchOffsets (after leave)', admin.fetchOffsets({ groupId: GROUP, topics: [TOPIC] }))
  for (const c of fo2[0].partitions) {
    check(Number(c.offset) === expected[c.partition].length,
      `after leave, fetchOffsets partition ${c.partition}: ${c.offset}, expected ${expected[c.partition].length}`)
  }
  log('describeGroups (Empty) ok')

  // delete the (now empty) group
  const del = await withTimeout('deleteGroups', admin.deleteGroups([GROUP]))
  check(del.length === 1 && del[0].groupId === GROUP && del[0].errorCode === 0, `deleteGroups: ${fmt(del)}`)
  const lg2 = await withTimeout('listGroups (after delete)', admin.listGroups())
  check(!lg2.groups.some(x => x.groupId === GROUP), `group ${GROUP} still listed after deleteGroups`)
  log('deleteGroups ok')

  // -- deleteTopics
  await withTimeout('producer.disconnect', producer.disconnect())
  await withTimeout('deleteTopics', admin.deleteTopics({ topics: [TOPIC], timeout: 10000 }))
  await waitFor('the topic to disappear from listTopics', async () => !(await admin.listTopics()).includes(TOPIC), 10000, 100)
  log('deleteTopics ok')

  await withTimeout('admin.disconnect', admin.disconnect())
}

const overall = setTimeout(() => {
  console.error(`FAIL: overall timeout of ${OVERALL_TIMEOUT_MS}ms reached`)
  process.exit(2)
}, OVERALL_TIMEOUT_MS)

main().then(
  () => {
    clearTimeout(overall)
    log('PASS: kafkajs smoke test')
    process.exit(0)
  },
  async err => {
    const kind = err instanceof Mismatch ? 'mismatch' : 'error'
    console.error(`FAIL (${kind}): ${err && (err.stack || err)}`)
    if (err && err.originalError) console.error(`  caused by: ${err.originalError.stack || err.originalError}`)
    if (err && err.type) console.error(`  kafka error type: ${err.type} code: ${err.code}`)
    // best-effort cleanup, bounded
    await Promise.race([
      Promise.allSettled([...consumers.map(c => c.disconnect()), producer.disconnect(), admin.disconnect()]),
      new Promise(r => setTimeout(r, 5000)),
    ])
    process.exit(1)
  }
)
