/* The peer of whend's NATS forwarding in the benchmark: libnats alone publishing the same
 * records to JetStream as whend's nats plugin does — one message per record, its JSON as the
 * payload, a Nats-Msg-Id header, asynchronous publishing with the same window and the same
 * per-message ack timeout — with nothing else to do: the records are read into memory before the
 * clock starts, and the subject is one fixed string. It prints the seconds from the first
 * publish to the last acknowledgement.
 *
 * usage: nats-peer URL STREAM SUBJECT RECORDS.ndjson MAX_IN_FLIGHT */
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile long failures;

static void acknowledged(jsCtx *js, natsMsg *message, jsPubAck *ack, jsPubAckErr *error, void *closure) {
    (void)js, (void)ack, (void)closure;
    if (error != NULL) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    natsMsg_Destroy(message);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: nats-peer URL STREAM SUBJECT RECORDS.ndjson MAX_IN_FLIGHT\n");
        return 2;
    }
    FILE *file = fopen(argv[4], "rb");
    if (file == NULL) {
        perror(argv[4]);
        return 1;
    }
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *records = malloc((size_t)size + 1);
    if (records == NULL || fread(records, 1, (size_t)size, file) != (size_t)size) {
        fprintf(stderr, "cannot read %s\n", argv[4]);
        return 1;
    }
    fclose(file);

    natsConnection *connection = NULL;
    jsCtx *js = NULL;
    jsOptions options;
    if (natsConnection_ConnectTo(&connection, argv[1]) != NATS_OK) {
        fprintf(stderr, "cannot connect to %s\n", argv[1]);
        return 1;
    }
    jsOptions_Init(&options);
    options.PublishAsync.MaxPending = atol(argv[5]);
    options.PublishAsync.StallWait = 1000;
    options.PublishAsync.AckHandler = acknowledged;
    if (natsConnection_JetStream(&js, connection, &options) != NATS_OK) return 1;
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    const char *subjects[] = {argv[3]};
    config.Name = argv[2];
    config.Subjects = subjects;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    config.Duplicates = 600 * (int64_t)1000000000;
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    if (js_AddStream(&info, js, &config, NULL, &code) != NATS_OK) {
        fprintf(stderr, "cannot create stream %s (%d)\n", argv[2], (int)code);
        return 1;
    }
    jsStreamInfo_Destroy(info);

    jsPubOptions publish;
    jsPubOptions_Init(&publish);
    publish.MaxWait = 5000;
    char id[64];
    long count = 0;
    double start = now();
    for (char *line = records, *end; line < records + size; line = end + 1) {
        end = memchr(line, '\n', (size_t)(records + size - line));
        if (end == NULL) end = records + size;
        if (end == line) continue;
        natsMsg *message = NULL;
        if (natsMsg_Create(&message, argv[3], NULL, line, (int)(end - line)) != NATS_OK) return 1;
        snprintf(id, sizeof id, "peer-%ld", ++count);
        natsMsgHeader_Set(message, "Nats-Msg-Id", id);
        while (js_PublishMsgAsync(js, &message, &publish) != NATS_OK) {
        }
    }
    jsPubOptions_Init(&publish);
    publish.MaxWait = 600000;
    if (js_PublishAsyncComplete(js, &publish) != NATS_OK) {
        fprintf(stderr, "not every message was acknowledged\n");
        return 1;
    }
    printf("%.6f %ld %ld\n", now() - start, count, failures);
    jsCtx_Destroy(js);
    natsConnection_Destroy(connection);
    free(records);
    return failures == 0 ? 0 : 1;
}
