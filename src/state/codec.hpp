// A codec as the engine reads it (sync_internal.codec_columns, src/state/codec.sql): the one
// reading of a declaration and its table's columns, for the pass that encodes rows and for filing
// that writes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pg/spi.hpp"

namespace magic_sync::state {

struct CodecColumn {
    std::string name;       // as in the catalog
    std::string quoted;     // as an SQL identifier
    std::string json_name;  // as a canonical JSON string: a row's member name on the wire
    bool key = false;
    bool travels = false;   // sent to replicas
    bool may_file = false;  // taken from an upload: record's columns, both's replica_columns
    bool stamp = false;
    bool required = false;  // NOT NULL, with no default
    // A key column's type when its jsonb field casts straight to it, else empty.
    std::string key_cast;
};

struct Codec {
    int64_t id = 0;
    std::string table_name;  // as on the wire
    std::string relation;    // quoted, schema-qualified
    std::string kind;        // catalog, record or both
    std::string audience;    // nobody, all, own or group
    std::string to_column;
    std::string replica_column;
    // A both codec's rule as SQL over the row `t` and the replica's row `r` of the replicas
    // relation; none for the other kinds.
    pg::Value both_audience;
    std::vector<CodecColumn> columns;  // key columns first, in key order

    bool goes_down() const { return audience != "nobody"; }
    std::vector<std::string> key_columns() const;
    // The columns that do not travel.
    std::vector<std::string> hidden() const;
};

// The codecs with these ids or these names on the wire, by id; a codec whose table is gone is
// left out.
std::vector<Codec> load_codecs(pg::Spi& spi, const std::vector<int64_t>& ids,
                               const std::vector<std::string>& tables);

}  // namespace magic_sync::state
