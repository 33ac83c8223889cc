#!/usr/bin/env node
// kafkajs idempotent producer against Spate.
//
//   node tests/js/idempotent.js HOST:PORT TOPIC
//
// A producer with `idempotent: true` (InitProducerId, sequence numbers, acks=all) sends
// keyed messages in several sends; a consumer reads the topic back from the beginning and
// every value must be there exactly once, in send order per partition. Prints
// "PASS: kafkajs idempotent" and exits 0 when it matches.
'use strict'

const { Kafka, logLevel, Partitioners } = require('kafkajs')

const [bootstrap, topic] = process.argv.slice(2)
if (!bootstrap || !topic) {
  console.error('usage: node idempotent.js HOST:PORT TOPIC')
  process.exit(64)
}
const SENDS = 20
const PER_SEND = 25

const kafka = new Kafka({
  clientId: 'spate-kafkajs-idempotent',
  brokers: [bootstrap],
  connectionTimeout: 5000,
  requestTimeout: 15000,
  logLevel: logLevel.WARN,
})

async function main() {
  const producer = kafka.producer({ idempotent: true, createPartitioner: Partitioners.DefaultPartitioner })
  await producer.connect()
  const sent = {}
  for (let s = 0; s < SENDS; s++) {
    const messages = []
    for (let i = 0; i < PER_SEND; i++) {
      const n = s * PER_SEND + i
      messages.push({ key: `k${n % 6}`, value: `v${String(n).padStart(5, '0')}` })
    }
    const results = await producer.send({ topic, messages })
    for (const r of results) {
      if (r.errorCode !== 0) throw new Error(`send error ${JSON.stringify(r)}`)
    }
  }
  await producer.disconnect()

  const consumer = kafka.consumer({ groupId: `idem-${Date.now()}`, maxWaitTimeInMs: 100 })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  const got = {}
  let n = 0
  const total = SENDS * PER_SEND
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out with ${n} of ${total}`)), 60000)
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        ;(got[partition] = got[partition] || []).push(message.value.toString())
        n += 1
        if (n >= total) {
          clearTimeout(timer)
          resolve()
        }
      },
    })
  })
  await new Promise(r => setTimeout(r, 500)) // anything extra (a duplicate) arrives too
  await consumer.disconnect()
  const all = Object.values(got).flat()
  if (all.length !== total) throw new Error(`read ${all.length} messages, sent ${total}`)
  if (new Set(all).size !== total) throw new Error('duplicates read back')
  for (const [p, values] of Object.entries(got)) {
    const sorted = [...values].sort()
    if (JSON.stringify(sorted) !== JSON.stringify(values)) throw new Error(`partition ${p} out of order`)
  }
  console.log(`read ${total} messages exactly once, in order`)
  console.log('PASS: kafkajs idempotent')
}

main().then(
  () => process.exit(0),
  e => {
    console.error('FAIL:', e && e.stack ? e.stack : e)
    process.exit(1)
  },
)
