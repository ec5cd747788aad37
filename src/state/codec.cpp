#include "state/codec.hpp"

#include "protocol/upload_fields.hpp"

namespace magic_sync::state {

std::vector<std::string> Codec::key_columns() const {
    std::vector<std::string> names;
    for (const CodecColumn& column : columns)
        if (column.key) names.push_back(column.name);
    return names;
}

std::vector<std::string> Codec::hidden() const {
    std::vector<std::string> names;
    for (const CodecColumn& column : columns)
        if (!column.travels) names.push_back(column.name);
    return names;
}

std::vector<Codec> load_codecs(pg::Spi& spi, const std::vector<int64_t>& ids,
                               const std::vector<std::string>& tables) {
    std::vector<Codec> codecs;
    auto rows =
        spi.query("SELECT * FROM sync_internal.codec_columns($1::bigint[]::int[], $2::text[])",
                  {pg::Param::bigint_array(ids), pg::Param::text_array(tables)});
    for (const pg::Row& row : rows) {
        const int64_t id = row["id"].integer();
        if (codecs.empty() || codecs.back().id != id) {
            Codec codec;
            codec.id = id;
            codec.table_name = row["table_name"].value();
            codec.relation = row["relation"].value();
            codec.kind = row["kind"].value();
            codec.audience = row["audience"].value();
            codec.to_column = row["to_column"].value_or("");
            codec.replica_column = row["replica_column"].value_or("");
            codec.both_audience = row["both_audience"];
            codecs.push_back(std::move(codec));
        }
        CodecColumn column;
        column.name = row["column_name"].value();
        column.quoted = pg::quote_identifier(column.name);
        column.json_name = protocol::json_string(column.name);
        column.key = row["is_key"].flag_or(false);
        column.travels = row["travels"].flag_or(false);
        column.may_file = row["may_file"].flag_or(false);
        column.stamp = row["is_stamp"].flag_or(false);
        column.required = row["is_required"].flag_or(false);
        column.key_cast = row["key_cast"].value_or("");
        codecs.back().columns.push_back(std::move(column));
    }
    return codecs;
}

}  // namespace magic_sync::state
